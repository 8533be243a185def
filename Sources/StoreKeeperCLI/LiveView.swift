import Foundation
import Synchronization

/// One line per step: a spinner (and a progress bar for the bulk part) while it runs on a
/// terminal, then ✔ or ✘ with what it showed.
final class LiveView: @unchecked Sendable {  // mutable state behind `lock`
    let animated: Bool
    private let lock = NSLock()
    private var progress: (done: Int, total: Int)?

    init(animated: Bool) { self.animated = animated }

    func say(_ text: String) { FileHandle.standardOutput.write(Data((text + "\n").utf8)) }

    func setProgress(done: Int, total: Int) { lock.withLock { progress = (done, total) } }

    /// Runs `body`; its string is the step's outcome, a thrown error its failure.
    func step(_ number: Int, _ total: Int, _ title: String, _ body: () async throws -> String) async -> String? {
        let label = "[\(number)/\(total)] \(title)"
        lock.withLock { progress = nil }
        let started = ContinuousClock.now
        let spinner: Task<Void, Never>? =
            animated
            ? Task {
                let frames = Array("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
                var index = 0
                while !Task.isCancelled {
                    let bar = lock.withLock { progress }.map { Self.bar($0.done, $0.total) } ?? ""
                    let seconds = String(format: "%.1f s", (ContinuousClock.now - started).seconds)
                    FileHandle.standardOutput.write(
                        Data("\r\u{1B}[2K\(frames[index % frames.count]) \(label) \(bar) \(seconds)".utf8))
                    index += 1
                    try? await Task.sleep(for: .milliseconds(100))
                }
            } : nil
        let outcome: Result<String, Error>
        do { outcome = .success(try await body()) } catch { outcome = .failure(error) }
        spinner?.cancel()
        _ = await spinner?.value
        let seconds = String(format: "%.1f s", (ContinuousClock.now - started).seconds)
        let clear = animated ? "\r\u{1B}[2K" : ""
        switch outcome {
        case .success(let detail):
            FileHandle.standardOutput.write(Data("\(clear)✔ \(label) — \(detail) (\(seconds))\n".utf8))
            return nil
        case .failure(let error):
            FileHandle.standardOutput.write(Data("\(clear)✘ \(label) — \(error) (\(seconds))\n".utf8))
            return "\(title): \(error)"
        }
    }

    static func bar(_ done: Int, _ total: Int) -> String {
        let width = 24
        let filled = total > 0 ? min(width, done * width / total) : 0
        return "[" + String(repeating: "█", count: filled) + String(repeating: "·", count: width - filled)
            + "] \(done)/\(total)"
    }
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
