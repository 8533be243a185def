/// A streaming pre-scan of BER/DER that bounds what a full parse will cost.
///
/// swift-asn1 materialises one node per element, so 8 MB of `30 00` would become millions of
/// nodes. This walk uses no allocation per element and stops at the first element over
/// budget, too deep, or longer than the bytes present: a hostile receipt costs at most a
/// linear scan.
enum ASN1Budget {
    struct Exceeded: Error, CustomStringConvertible {
        var description: String
    }

    /// Throws unless `bytes` is exactly one element whose tree has at most `maxNodes` nodes
    /// and `maxDepth` levels.
    static func check(_ bytes: ArraySlice<UInt8>, maxNodes: Int, maxDepth: Int = 32) throws {
        var index = bytes.startIndex
        var nodes = 0
        // Ends of the enclosing definite-length elements (nil for indefinite length).
        var stack: [Int?] = []
        stack.reserveCapacity(maxDepth)
        var sawRoot = false

        while true {
            // Close finished definite-length elements.
            while let top = stack.last, let end = top, index == end { stack.removeLast() }
            if stack.isEmpty && sawRoot { break }
            if let top = stack.last, let end = top, index > end {
                throw Exceeded(description: "element overruns its parent")
            }
            guard index < bytes.endIndex else {
                throw Exceeded(description: "truncated ASN.1 (\(stack.count) elements unclosed)")
            }
            // End-of-contents of an indefinite-length element.
            if bytes[index] == 0, let top = stack.last, top == nil {
                guard index + 1 < bytes.endIndex, bytes[index + 1] == 0 else {
                    throw Exceeded(description: "bad end-of-contents marker")
                }
                index += 2
                stack.removeLast()
                continue
            }
            sawRoot = true
            nodes += 1
            guard nodes <= maxNodes else { throw Exceeded(description: "more than \(maxNodes) ASN.1 elements") }

            let tag = bytes[index]
            index += 1
            if tag & 0x1F == 0x1F {  // high tag number form
                var count = 0
                while true {
                    guard index < bytes.endIndex, count < 4 else { throw Exceeded(description: "bad tag") }
                    let byte = bytes[index]
                    index += 1
                    count += 1
                    if byte & 0x80 == 0 { break }
                }
            }
            let constructed = tag & 0x20 != 0
            guard index < bytes.endIndex else { throw Exceeded(description: "truncated length") }
            let first = bytes[index]
            index += 1
            var length: Int?
            if first < 0x80 {
                length = Int(first)
            } else if first == 0x80 {
                guard constructed else { throw Exceeded(description: "indefinite length on a primitive") }
                length = nil
            } else {
                let count = Int(first & 0x7F)
                guard count <= 4, bytes.endIndex - index >= count else {
                    throw Exceeded(description: "length field too long")
                }
                var value = 0
                for _ in 0..<count {
                    value = value << 8 | Int(bytes[index])
                    index += 1
                }
                length = value
            }
            if let length {
                guard length <= bytes.endIndex - index else {
                    throw Exceeded(description: "length \(length) exceeds the \(bytes.endIndex - index) bytes present")
                }
                if constructed {
                    guard stack.count < maxDepth else { throw Exceeded(description: "nested deeper than \(maxDepth)") }
                    stack.append(index + length)
                } else {
                    index += length
                }
            } else {
                guard stack.count < maxDepth else { throw Exceeded(description: "nested deeper than \(maxDepth)") }
                stack.append(nil)
            }
            if stack.isEmpty { break }
        }
        guard index == bytes.endIndex else { throw Exceeded(description: "trailing bytes after the element") }
    }
}
