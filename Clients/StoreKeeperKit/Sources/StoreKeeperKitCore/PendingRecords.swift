import Foundation

/// The coordinator's state as records: one per intent, held transaction, settled id and account
/// view, each in a versioned envelope (`{"v": 2, "value": …}`). A record this SDK cannot read —
/// damaged, or written by a newer version — is kept as it is and never overwritten; the rest
/// load. The one-document format of version 1 (key `legacy`) is migrated on first load.
public enum PendingRecords {
    public static let version = 2
    public static let legacyKey = "legacy"

    enum Record: Equatable {
        case intent(PurchaseIntent)
        case pending(PendingSubmission)
        case settled(SettledTransaction)
        case account(CustomerInfo)
    }

    struct Envelope<Value: Codable>: Codable {
        var v: Int
        var value: Value
    }

    struct Header: Decodable { var v: Int }

    /// Version 1: everything in one document.
    struct LegacyDocument: Decodable {
        var intents: [PurchaseIntent]?
        var pending: [PendingSubmission]?
        var settled: [SettledTransaction]?
        var customerInfo: [String: CustomerInfo]?
    }

    static func key(_ record: Record) -> String {
        switch record {
        case .intent(let intent): "intent:" + intent.appAccountToken.uuidString.lowercased()
        case .pending(let item): "pending:" + item.key
        case .settled(let settled): "settled:" + settled.key
        case .account(let info): "account:" + info.accountId
        }
    }

    static func records(_ state: PendingState) -> [String: Record] {
        var records: [String: Record] = [:]
        records.reserveCapacity(state.intents.count + state.pending.count + state.settled.count + 4)
        for intent in state.intents { records[key(.intent(intent))] = .intent(intent) }
        for item in state.pending { records[key(.pending(item))] = .pending(item) }
        for settled in state.settled { records[key(.settled(settled))] = .settled(settled) }
        for info in state.customerInfo.values { records[key(.account(info))] = .account(info) }
        return records
    }

    static func encode(_ record: Record) throws -> Data {
        let encoder = JSONEncoder.storeKeeper
        switch record {
        case .intent(let value): return try encoder.encode(Envelope(v: version, value: value))
        case .pending(let value): return try encoder.encode(Envelope(v: version, value: value))
        case .settled(let value): return try encoder.encode(Envelope(v: version, value: value))
        case .account(let value): return try encoder.encode(Envelope(v: version, value: value))
        }
    }

    /// The state in `records`, and whether a legacy document was migrated (then everything is
    /// to be written as records and the document removed).
    public static func decode(_ records: [String: Data]) -> (state: PendingState, migrated: Bool) {
        var state = PendingState()
        let decoder = JSONDecoder.storeKeeper
        var migrated = false
        if let legacy = records[legacyKey] {
            if let document = try? decoder.decode(LegacyDocument.self, from: legacy) {
                state.intents = document.intents ?? []
                state.pending = document.pending ?? []
                state.settled = document.settled ?? []
                state.customerInfo = document.customerInfo ?? [:]
                migrated = true
            } else {
                state.unreadable.append(legacyKey)
            }
        }
        for (key, data) in records.sorted(by: { $0.key < $1.key }) where key != legacyKey {
            guard let header = try? decoder.decode(Header.self, from: data), header.v <= version else {
                state.unreadable.append(key)
                continue
            }
            let kind = key.prefix { $0 != ":" }
            switch kind {
            case "intent":
                if let value = try? decoder.decode(Envelope<PurchaseIntent>.self, from: data).value {
                    state.intents.removeAll { $0.appAccountToken == value.appAccountToken }
                    state.intents.append(value)
                } else {
                    state.unreadable.append(key)
                }
            case "pending":
                if let value = try? decoder.decode(Envelope<PendingSubmission>.self, from: data).value {
                    state.pending.removeAll { $0.key == value.key }
                    state.pending.append(value)
                } else {
                    state.unreadable.append(key)
                }
            case "settled":
                if let value = try? decoder.decode(Envelope<SettledTransaction>.self, from: data).value {
                    state.settled.append(value)
                } else {
                    state.unreadable.append(key)
                }
            case "account":
                if let value = try? decoder.decode(Envelope<CustomerInfo>.self, from: data).value {
                    state.customerInfo[value.accountId] = value
                } else {
                    state.unreadable.append(key)
                }
            default:
                state.unreadable.append(key)
            }
        }
        // A crash between writing a verdict and removing what it settled leaves both: the verdict wins.
        let settledKeys = Set(state.settled.map(\.key))
        state.pending.removeAll { settledKeys.contains($0.key) }
        state.settled.sort { $0.at < $1.at }
        state.intents.sort { $0.createdAt < $1.createdAt }
        state.pending.sort { $0.transaction.purchaseDate < $1.transaction.purchaseDate }
        return (state, migrated)
    }

    /// What to write and remove to go from `old` to `new`: only the records that changed.
    static func changes(from old: [String: Record], to new: [String: Record]) throws -> (
        write: [String: Data], remove: [String]
    ) {
        var write: [String: Data] = [:]
        for (key, record) in new where old[key] != record { write[key] = try encode(record) }
        let remove = old.keys.filter { new[$0] == nil }.sorted()
        return (write, remove)
    }
}
