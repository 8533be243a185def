import ArgumentParser
import Foundation
import Hummingbird
import KeyFiles
import Logging
import StoreKeeperMCP
import StoreKeeperServer

/// `storekeeper mcp`: the support desk for agents over the Model Context Protocol — on
/// stdin/stdout with one key, or as a streamable HTTP listener where each request brings its own.
struct MCPCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mcp",
        abstract: "The support desk for AI agents: StoreKeeper's tools over the Model Context Protocol.",
        discussion: """
            Each tool is one call of a running StoreKeeper server's API (--server) with an operator key \
            (auth.keys), so its scope, app limits and audit log hold as for the dashboard: a read key is \
            offered look-ups, account views and analytics only; a support key adds credit, debit, grants, \
            refunds, transfers, extensions, notes and anomalies. Over stdio the key comes from the \
            STOREKEEPER_KEY environment variable or --key-file; with --http each request brings its own \
            (Authorization: Bearer). Logs go to stderr.
            """
    )

    @Option(help: "The StoreKeeper server's base URL.")
    var server: String = "http://127.0.0.1:8080"

    @Option(name: .customLong("key-file"), help: "A file holding the operator key (stdio; else STOREKEEPER_KEY).")
    var keyFile: String?

    @Flag(help: "Serve MCP's streamable HTTP transport at POST /mcp instead of stdio.")
    var http = false

    @Option(help: "With --http: the address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "With --http: the port to listen on.")
    var port: Int = 8090

    @Option(
        name: .customLong("allowed-host"),
        help: "With --http: a Host header value to answer (repeatable; default 127.0.0.1, localhost and [::1]).")
    var allowedHosts: [String] = []

    func validate() throws {
        guard let url = URL(string: server), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else {
            throw ValidationError("--server must be an http(s) URL, e.g. http://127.0.0.1:8080")
        }
        guard (0...65_535).contains(port) else { throw ValidationError("--port must be 0…65535") }
        if http, keyFile != nil {
            throw ValidationError("--key-file is for stdio: over HTTP each request brings its key")
        }
    }

    func run() async throws {
        // stdout is the protocol's over stdio: every log line goes to stderr.
        // Through the server's handler: control characters in a client's text are escaped, one
        // event is one line.
        LoggingSystem.bootstrap { label in
            var handler = LazyMetadataLogHandler(label: label)
            handler.logLevel = .notice
            return handler
        }
        let desk = SupportDesk(serverURL: URL(string: server)!, logger: Logger(label: "storekeeper.mcp"))
        do {
            if http {
                let application = try await desk.httpApplication(
                    host: host, port: port, allowedHosts: allowedHosts.isEmpty ? nil : allowedHosts)
                try await application.runService()
            } else {
                try await desk.serveStdio(key: try Self.key(file: keyFile))
            }
        } catch let error as DeskError {
            FileHandle.standardError.write(Data("storekeeper mcp: \(error)\n".utf8))
            throw ExitCode(2)
        }
    }

    static func key(file: String?) throws -> String {
        if let file {
            if let exposure = KeyFiles.exposure(of: file) { throw ValidationError("--key-file: \(exposure)") }
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                throw ValidationError("--key-file: cannot read \(file)")
            }
            return text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard let key = ProcessInfo.processInfo.environment["STOREKEEPER_KEY"], !key.isEmpty else {
            throw ValidationError("give the operator key in STOREKEEPER_KEY or --key-file")
        }
        return key
    }
}
