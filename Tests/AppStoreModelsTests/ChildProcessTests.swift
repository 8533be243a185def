import Foundation
import StoreKeeperSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `ChildProcess`: what the tests and the bench rely on when they start a child.
@Suite struct ChildProcessTests {
    /// Runs `/bin/sh -c script` to its end: its standard output and the process.
    func shell(_ script: String, environment: [String: String]? = nil) throws -> (output: String, process: ChildProcess)
    {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", script]
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        // The parent's copy of the writing end is closed by `run()`: the read ends with the child.
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (String(decoding: data, as: UTF8.self), process)
    }

    @Test func exitCodesSignalsAndOutputAreReportedAsProcessReportsThem() throws {
        let (output, done) = try shell("echo hello; exit 7")
        #expect(output == "hello\n")
        #expect(!done.isRunning && done.terminationStatus == 7 && done.terminationReason == .exit)
        let (_, killed) = try shell("kill -TERM $$; sleep 5")
        #expect(killed.terminationStatus == SIGTERM && killed.terminationReason == .uncaughtSignal)
    }

    @Test func theChildGetsItsEnvironmentAndNothingElseOfOurs() throws {
        let (output, _) = try shell(
            "echo \"$CHILD_TEST\"; env | grep -c CHILD_OTHER", environment: ["CHILD_TEST": "x y"])
        #expect(output == "x y\n0\n")
        #if canImport(Glibc)
            // A descriptor open here (not close-on-exec) is not the child's: it sees 0, 1 and 2
            // (and the one its own listing opens).
            var fds: [Int32] = [0, 0]
            #expect(pipe(&fds) == 0)
            defer {
                close(fds[0])
                close(fds[1])
            }
            let (listing, _) = try shell("ls /proc/$$/fd")
            let open = Set(listing.split(separator: "\n").compactMap { Int32($0) })
            #expect(!open.contains(fds[0]) && !open.contains(fds[1]), "\(open.sorted()) holds \(fds)")
            #expect(open.isSuperset(of: [0, 1, 2]) && open.count <= 4, "\(open.sorted())")
        #endif
    }

    @Test func aRunningChildIsSeenRunningAndEndsOnTerminate() throws {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sleep")
        process.arguments = ["30"]
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        #expect(process.isRunning && process.processIdentifier > 0)
        process.terminate()
        process.waitUntilExit()
        #expect(!process.isRunning && process.terminationReason == .uncaughtSignal)
        // Signals after the end go nowhere.
        process.terminate()
    }

    #if canImport(Glibc)
        /// A child something else reaped (a `waitpid` outside this type) does not hang the wait:
        /// its status is gone, so it reads as exit 255 within a bounded time.
        @Test func aChildReapedElsewhereEndsTheWaitWithAnUnknownStatus() throws {
            let process = ChildProcess()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", "exit 3"]
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            var status: Int32 = 0
            #expect(waitpid(process.processIdentifier, &status, 0) == process.processIdentifier)
            process.waitUntilExit()
            #expect(!process.isRunning && process.terminationStatus == 255)
        }
    #endif

    @Test func aMissingExecutableIsAnError() {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/nonexistent/storekeeper-child")
        #expect(throws: ChildProcess.SpawnFailed.self) { try process.run() }
        #expect(!process.isRunning)
    }
}
