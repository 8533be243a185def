import Foundation
import StoreKeeperFuzzTargets

// Built by `scripts/fuzz` with `-sanitize=fuzzer,address -DSTOREKEEPER_FUZZING`, this is a
// libFuzzer binary for the target named by STOREKEEPER_FUZZ_TARGET. Built normally it replays
// inputs (`storekeeper-fuzz replay TARGET FILE…`) and writes the seed corpus
// (`storekeeper-fuzz seeds DIR [VECTORS]`).

/// The trust roots the seed corpus was signed with: `$STOREKEEPER_FUZZ_DIR/trust` (`Fuzz/trust`).
func makeFuzzer() -> Fuzzer {
    let directory = ProcessInfo.processInfo.environment["STOREKEEPER_FUZZ_DIR"] ?? "Fuzz"
    do {
        return try Fuzzer(extraRoots: Fuzzer.roots(in: URL(fileURLWithPath: directory).appendingPathComponent("trust")))
    } catch {
        FileHandle.standardError.write(Data("storekeeper-fuzz: \(error)\n".utf8))
        exit(2)
    }
}

#if STOREKEEPER_FUZZING
    @_silgen_name("LLVMFuzzerRunDriver")
    func runDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt

    @_silgen_name("__lsan_disable") func lsanDisable()
    @_silgen_name("__lsan_enable") func lsanEnable()

    nonisolated(unsafe) var fuzzer: Fuzzer!
    nonisolated(unsafe) var target: FuzzTarget = .jws

    @_cdecl("LLVMFuzzerTestOneInput")
    public func testOneInput(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
        fuzzer.runBlocking(target, count == 0 ? [] : Array(UnsafeBufferPointer(start: start, count: count)))
        return 0
    }

    // SwiftPM links an executable's `main` to this module's entry point, so the entry point
    // hands libFuzzer its arguments instead of using libFuzzer's own `main`.
    @main struct FuzzMain {
        static func main() {
            let name = ProcessInfo.processInfo.environment["STOREKEEPER_FUZZ_TARGET"] ?? ""
            guard let chosen = FuzzTarget(rawValue: name) else {
                let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
                FileHandle.standardError.write(Data("set STOREKEEPER_FUZZ_TARGET to one of: \(names)\n".utf8))
                exit(64)
            }
            target = chosen
            // What lives for the whole run (the verifiers, their parsed roots) is allocated
            // outside LeakSanitizer's view: Swift keeps some of its pointers with tag bits in
            // enum payloads, which LeakSanitizer cannot follow from a global, so it would
            // report them as leaked. Everything an input allocates is still checked.
            lsanDisable()
            fuzzer = makeFuzzer()
            lsanEnable()
            var argc = CommandLine.argc
            var argv = CommandLine.unsafeArgv
            exit(runDriver(&argc, &argv, testOneInput))
        }
    }
#else
    @main struct FuzzMain {
        static func main() async {
            let arguments = Array(CommandLine.arguments.dropFirst())
            switch arguments.first {
            case "seeds" where arguments.count >= 2:
                do {
                    try await FuzzSeeds.write(
                        to: URL(fileURLWithPath: arguments[1]),
                        genuineVectors: arguments.count > 2 ? URL(fileURLWithPath: arguments[2]) : nil)
                } catch {
                    FileHandle.standardError.write(Data("storekeeper-fuzz: \(error)\n".utf8))
                    exit(1)
                }
            case "replay" where arguments.count >= 2:
                guard let target = FuzzTarget(rawValue: arguments[1]) else { usage() }
                let fuzzer = makeFuzzer()
                for path in arguments.dropFirst(2) {
                    guard let data = FileManager.default.contents(atPath: path) else {
                        FileHandle.standardError.write(Data("cannot read \(path)\n".utf8))
                        exit(1)
                    }
                    await fuzzer.run(target, [UInt8](data))
                    print("ok \(path)")
                }
            default:
                usage()
            }
        }

        static func usage() -> Never {
            let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: "|")
            FileHandle.standardError.write(
                Data(
                    "usage: storekeeper-fuzz seeds DIR [VECTORS_DIR] | replay \(names) FILE…\n(fuzzing: scripts/fuzz TARGET SECONDS)\n"
                        .utf8))
            exit(64)
        }
    }
#endif
