import AppStoreAdapter
import AppStoreModels
import Foundation
import SQLKit
import StoreKeeperCore
import Testing

@testable import StoreKeeperStorage

/// A notification's `signedPayload` is stored with its JWS headers by reference, and read back
/// byte for byte — for Apple's own JWS, for anything hostile, and through the database.
@Suite struct StoredJWSTests {
    /// Apple's genuine signed transaction (its header carries Apple's real x5c chain).
    static let appleTransaction: String = {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/apple-transaction-sandbox-consumable.jws")
        return (try? String(contentsOf: url, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
    }()

    /// A notification as Apple writes one: a JWS whose payload carries two more signed JWS,
    /// all three with the same header.
    static func notification(uuid: String = UUID().uuidString, extra: String = "") -> String {
        let parts = appleTransaction.split(separator: ".").map(String.init)
        let payload = """
            {"notificationType":"DID_RENEW","notificationUUID":"\(uuid)","data":{"bundleId":"com.example",\
            "signedTransactionInfo":"\(appleTransaction)","signedRenewalInfo":"\(appleTransaction)",\
            "environment":"Sandbox","status":1}\(extra),"version":"2.0","signedDate":1700000000000}
            """
        return parts[0] + "." + Base64.encodeURL(Array(payload.utf8)) + "." + parts[2]
    }

    @Test func appleJWSAndANotificationRoundTripAndShrink() throws {
        #expect(Self.appleTransaction.split(separator: ".").count == 3)
        for jws in [Self.appleTransaction, Self.notification()] {
            let packed = try #require(StoredJWS.pack(jws))
            #expect(packed.text.hasPrefix(StoredJWS.marker))
            // One header: the three JWS share Apple's chain.
            #expect(packed.headers.count == 1)
            #expect(try StoredJWS.unpack(packed.text) { packed.headers[$0] } == jws)
        }
        let notification = Self.notification()
        let packed = try #require(StoredJWS.pack(notification))
        // 15 KB as sent; the headers were nearly all of it.
        #expect(packed.text.utf8.count * 5 < notification.utf8.count)
    }

    @Test func textsThatAreNotCompactJWSAreKeptAsSent() throws {
        for text in ["", "abc", "a.b", "a.b.c.d", ".", "..", "~1.x.y.z", Self.appleTransaction + ".x"] {
            #expect(StoredJWS.pack(text) == nil, "\(text.prefix(40))")
            // A text without the marker is its own stored form.
            if !text.hasPrefix(StoredJWS.marker) {
                #expect(try StoredJWS.unpack(text) { _ in nil } == text)
            }
        }
        // A payload that is not base64url, or not text, or has a NUL.
        let header = String(Self.appleTransaction.split(separator: ".")[0])
        for payload in ["!!!!", Base64.encodeURL([0xFF, 0xFE, 0x41]), Base64.encodeURL(Array("{\"a\":\"\0\"}".utf8))] {
            #expect(StoredJWS.pack(header + "." + payload + ".sig") == nil)
        }
    }

    @Test func aPayloadThatAlreadyLooksPackedIsKeptAsSent() throws {
        let id = StoredJWS.id(Array("x".utf8))
        let hostile = Self.notification(extra: ",\"note\":\"~\(id).\"")
        #expect(StoredJWS.pack(hostile) == nil)
        // A reference to a header that is not recorded cannot be read.
        let packed = try #require(StoredJWS.pack(Self.notification()))
        #expect(throws: StoredJWS.UnknownHeader.self) { try StoredJWS.unpack(packed.text) { _ in nil } }
        // Cut short anywhere: never a wrong text, an error or (before the payload) unknown.
        for length in stride(from: 0, to: packed.text.utf8.count, by: 7) {
            let cut = String(decoding: Array(packed.text.utf8)[..<length], as: UTF8.self)
            if let text = try? StoredJWS.unpack(cut, header: { packed.headers[$0] }) {
                #expect(text != Self.notification())
            }
        }
    }

    /// Any text, however mutated, is either stored as sent or stored packed and read back
    /// exactly.
    @Test func mutatedNotificationsRoundTripOrAreKeptAsSent() throws {
        var generator = SystemRandomNumberGenerator()
        let original = Array(Self.notification().utf8)
        let alphabet = Array("~.\"\\eyJA-_=0/+ \u{0}".utf8)
        var packedCount = 0
        for _ in 0..<1500 {
            var bytes = original
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                let at = Int.random(in: 0..<bytes.count, using: &generator)
                let byte = alphabet.randomElement(using: &generator)!
                switch Int.random(in: 0..<3, using: &generator) {
                case 0: bytes[at] = byte
                case 1: bytes.insert(byte, at: at)
                default: bytes.remove(at: at)
                }
            }
            // Also mutate inside the payload: decode, change, encode.
            let text = String(decoding: bytes, as: UTF8.self)
            guard let packed = StoredJWS.pack(text) else { continue }
            packedCount += 1
            #expect(try StoredJWS.unpack(packed.text) { packed.headers[$0] } == text)
        }
        let parts = Self.notification().split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        let json = Array(Base64.decodeURL(parts[1])!)
        for _ in 0..<1500 {
            var mutated = json
            let at = Int.random(in: 0..<mutated.count, using: &generator)
            mutated.insert(contentsOf: [UInt8](alphabet.shuffled(using: &generator).prefix(3)), at: at)
            let text = parts[0] + "." + Base64.encodeURL(mutated) + "." + parts[2]
            guard let packed = StoredJWS.pack(text) else { continue }
            packedCount += 1
            #expect(try StoredJWS.unpack(packed.text) { packed.headers[$0] } == text)
        }
        #expect(packedCount > 1000)
    }

    /// Through the database: stored packed, the header once, read back exactly — also by a
    /// store that has never seen the header (another instance, or after a restart).
    @Test(arguments: PurchaseStoreTests.kinds)
    func notificationsAreStoredPackedAndReadBackExactly(kind: Database.Kind) async throws {
        try await TestDatabase.with(kind) { database in
            let store = NotificationStore(database: database)
            let sent = (0..<5).map { index in (UUID().uuidString, Self.notification(uuid: "n\(index)")) }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (uuid, signedPayload) in sent {
                    group.addTask {
                        let record = NotificationRecord(
                            notificationUUID: uuid, type: "TEST", subtype: nil, notice: .test,
                            signedDate: 1_700_000_000_000,
                            environment: "Sandbox")
                        try await store.accept(record, signedPayload: signedPayload, now: Date())
                    }
                }
                try await group.waitForAll()
            }
            // A payload stored before packing existed (or one that cannot be packed) reads as is.
            try await database.transaction { sql in
                try await sql.raw(
                    """
                    INSERT INTO notifications (notification_uuid, notification_type, subject, signed_date,
                    signed_payload, status, received_at) VALUES ('old', 'TEST', '', 1, \(bind: Self.appleTransaction),
                    'ignored', 1)
                    """
                ).run()
            }
            // Never stored so that it would be read back as something else.
            await #expect(throws: StoredJWS.Unstorable.self) {
                try await store.accept(
                    NotificationRecord(
                        notificationUUID: "marker", type: "TEST", subtype: nil, notice: .test, signedDate: 1,
                        environment: nil),
                    signedPayload: "~1.not.a.jws", now: Date())
            }
            let fresh = NotificationStore(database: database)
            try await database.read { sql in
                let headers = try await sql.raw("SELECT COUNT(*) AS n FROM jws_headers").first()?.decode(
                    column: "n", as: Int.self)
                #expect(headers == 1)
                for (uuid, signedPayload) in sent + [("old", Self.appleTransaction)] {
                    let stored = try #require(
                        try await sql.raw(
                            "SELECT signed_payload FROM notifications WHERE notification_uuid = \(bind: uuid)"
                        ).first()?.decode(column: "signed_payload", as: String.self))
                    #expect(stored.hasPrefix(StoredJWS.marker) == (uuid != "old"))
                    if uuid != "old" { #expect(stored.utf8.count * 5 < signedPayload.utf8.count) }
                    #expect(try await fresh.original(stored, sql: sql) == signedPayload)
                    #expect(try await store.original(stored, sql: sql) == signedPayload)
                }
                // A header that is not recorded: unreadable, not a wrong text.
                let packed = try #require(StoredJWS.pack(Self.notification()))
                let orphan = packed.text.replacingOccurrences(
                    of: packed.headers.keys.first!, with: StoredJWS.id(Array("other".utf8)))
                #expect(try await NotificationStore(database: database).original(orphan, sql: sql) == nil)
            }
        }
    }
}
