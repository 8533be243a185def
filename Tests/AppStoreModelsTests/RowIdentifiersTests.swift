import Foundation
import StoreKeeperSupport
import Testing

@Suite struct RowIdentifiersTests {
    /// Version 4 UUIDs in Foundation's lower-case text, never the same twice, from every thread.
    @Test func uniqueVersion4UUIDsFromManyThreads() async {
        let perTask = 20_000
        let batches = await withTaskGroup(of: [String].self) { group in
            for _ in 0..<8 { group.addTask { (0..<perTask).map { _ in RowIdentifiers.uuidString() } } }
            return await group.reduce(into: [[String]]()) { $0.append($1) }
        }
        let all = batches.flatMap { $0 }
        #expect(Set(all).count == 8 * perTask)
        for id in all.prefix(2_000) {
            let uuid = UUID(uuidString: id)
            #expect(uuid?.uuidString.lowercased() == id)
            let bytes = Array(id.utf8)
            #expect(bytes[14] == UInt8(ascii: "4"))  // version
            #expect([UInt8(ascii: "8"), UInt8(ascii: "9"), UInt8(ascii: "a"), UInt8(ascii: "b")].contains(bytes[19]))
        }
    }

    /// The bits are spread: each of the 122 random bits is set in roughly half of the ids (a
    /// counter or a constant would fail this).
    @Test func bitsLookRandom() {
        let count = 20_000
        var ones = [Int](repeating: 0, count: 128)
        for _ in 0..<count {
            let bytes = RowIdentifiers.uuidBytes()
            for bit in 0..<128 where bytes[bit / 8] & (0x80 >> UInt8(bit % 8)) != 0 { ones[bit] += 1 }
        }
        let fixed: Set<Int> = [48, 49, 50, 51, 64, 65]  // version 0100, variant 10
        for bit in 0..<128 where !fixed.contains(bit) {
            #expect((count * 45 / 100...count * 55 / 100).contains(ones[bit]), "bit \(bit): \(ones[bit])")
        }
        #expect(ones[48] == 0 && ones[49] == count && ones[50] == 0 && ones[51] == 0)
        #expect(ones[64] == count && ones[65] == 0)
    }

    /// Account tokens: version 4 UUIDs in lower case, from the system's generator — not the
    /// process's sequence, whose next ids follow from any one seen.
    @Test func randomUUIDStringsAreWellFormedVersion4() {
        let ids = (0..<2_000).map { _ in RowIdentifiers.randomUUIDString() }
        #expect(Set(ids).count == ids.count)
        for id in ids {
            #expect(UUID(uuidString: id)?.uuidString.lowercased() == id)
            let bytes = Array(id.utf8)
            #expect(bytes[14] == UInt8(ascii: "4"))
            #expect([UInt8(ascii: "8"), UInt8(ascii: "9"), UInt8(ascii: "a"), UInt8(ascii: "b")].contains(bytes[19]))
        }
    }
}
