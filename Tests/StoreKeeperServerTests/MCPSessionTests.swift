import AsyncHTTPClient
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import NIOHTTP1
import StoreKeeperMCP
import Testing

@testable import StoreKeeperServer

/// MCP's streamable HTTP over real connections (AsyncHTTPClient: many requests at once).
struct MCPHTTP: Sendable {
    let base: String
    var host: String?

    init(client: some TestClientProtocol, host: String? = nil) {
        base = "http://127.0.0.1:\(client.port!)"
        self.host = host
    }

    struct Answer: @unchecked Sendable {
        var status: HTTPResponse.Status
        var headers: HTTPHeaders
        var json: [String: Any]
        var session: String? { headers.first(name: "Mcp-Session-Id") }
        var body: String
    }

    static func initialize(_ id: Int) -> String {
        #"{"jsonrpc":"2.0","id":\#(id),"method":"initialize","params":{"protocolVersion":"2025-06-18","#
            + #""capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#
    }

    static func call(_ id: Int, _ tool: String, _ arguments: String) -> String {
        #"{"jsonrpc":"2.0","id":\#(id),"method":"tools/call","params":{"name":"\#(tool)","arguments":\#(arguments)}}"#
    }

    func post(
        _ body: String, key: String?, session: String? = nil, method: HTTPMethod = .POST,
        accept: String = "application/json, text/event-stream"
    ) async throws -> Answer {
        var request = HTTPClientRequest(url: base + "/mcp")
        request.method = method
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "Accept", value: accept)
        request.headers.add(name: "MCP-Protocol-Version", value: "2025-06-18")
        if let host { request.headers.replaceOrAdd(name: "Host", value: host) }
        if let key { request.headers.add(name: "Authorization", value: "Bearer \(key)") }
        if let session { request.headers.add(name: "Mcp-Session-Id", value: session) }
        if method == .POST { request.body = .bytes(ByteBuffer(string: body)) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
        let data = try await response.body.collect(upTo: 1 << 22)
        let json = (try? JSONSerialization.jsonObject(with: Data(buffer: data))) as? [String: Any]
        return Answer(
            status: HTTPResponse.Status(code: Int(response.status.code)), headers: response.headers,
            json: json ?? [:], body: String(buffer: data))
    }

    /// `initialize` then `notifications/initialized`: an open session.
    func open(key: String) async throws -> (session: String, hello: [String: Any]) {
        let hello = try await post(Self.initialize(1), key: key)
        #expect(hello.status == .ok, "\(hello.body)")
        let session = try #require(hello.session)
        let done = try await post(
            #"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, key: key, session: session)
        #expect(done.status == .accepted, "\(done.body)")
        return (session, hello.json)
    }

    func toolNames(key: String, session: String) async throws -> Set<String> {
        let answer = try await post(#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, key: key, session: session)
        let tools = (answer.json["result"] as? [String: Any])?["tools"] as? [[String: Any]] ?? []
        return Set(tools.compactMap { $0["name"] as? String })
    }
}

/// The fourth audit's HIGH: one agent's tool call ran with another agent's key whenever their
/// JSON-RPC ids collided, and only the first `initialize` per process worked. Each session is now
/// bound to its key; sessions never share answers, waits or keys.
@Suite struct MCPSessionTests {
    typealias Desk = MCPDeskTests
    static let credit =
        #"{"accountId":"u1","currency":"coins","amount":7,"reason":"r","idempotencyKey":"k-ID"}"#

    /// Eight sessions at once (four read, four support keys), every request numbered from the same
    /// ids, each calling `credit_balance` concurrently: only the support sessions credit; every
    /// credit is audited under the support key; every request is answered, none by another session.
    @Test func concurrentSessionsWithCollidingIdsKeepTheirOwnKeys() async throws {
        try await Desk.withLiveDesk("sqlite") { app, url, _ in
            let desk = SupportDesk(serverURL: url)
            try await desk.httpApplication(host: "127.0.0.1", port: 0).test(.live) { client in
                let http = MCPHTTP(client: client)
                let before = try await Desk.coins(app, "u1")
                let keys = (0..<8).map { $0.isMultiple(of: 2) ? Desk.reader : Desk.desk }
                var sessions: [String] = []
                for key in keys { sessions.append(try await http.open(key: key).session) }
                #expect(Set(sessions).count == 8)
                let opened = sessions
                let results = try await withThrowingTaskGroup(of: (Int, Int, Bool?).self) { group in
                    for round in 0..<5 {
                        for (index, key) in keys.enumerated() {
                            group.addTask {
                                let body = MCPHTTP.call(
                                    10 + round, "credit_balance",
                                    Self.credit.replacingOccurrences(of: "ID", with: "\(index)-\(round)"))
                                let answer = try await http.post(body, key: key, session: opened[index])
                                #expect(answer.status == .ok, "\(answer.body)")
                                #expect(answer.json["id"] as? Int == 10 + round)
                                let result = answer.json["result"] as? [String: Any]
                                return (index, round, result?["isError"] as? Bool)
                            }
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(results.count == 40)
                for (index, round, isError) in results {
                    // Read sessions (even) are refused; support sessions (odd) credit.
                    #expect(isError == index.isMultiple(of: 2), "session \(index), round \(round)")
                }
                #expect(try await Desk.coins(app, "u1") == before + 4 * 5 * 7)
                let audit = try await app.store.anomalies.audit().filter { $0.action == "balance_credited" }
                #expect(audit.count == 20)
                #expect(
                    audit.allSatisfy { $0.actor == "operator:support-desk (support, mcp)" }, "\(audit.map(\.actor))")
            }
        }
    }

    /// What the specification asks of the session: no session is 400, an unknown or another key's
    /// session 404, `DELETE` ends it (then 404), GET has no stream (405), a parse error answers
    /// `id: null`, a request id already in flight in the same session is refused (never displaces
    /// the first).
    @Test func sessionsAreBoundToTheirKeyAndEndable() async throws {
        try await Desk.withLiveDesk("sqlite") { _, url, _ in
            let desk = SupportDesk(serverURL: url)
            try await desk.httpApplication(host: "127.0.0.1", port: 0).test(.live) { client in
                let http = MCPHTTP(client: client)
                let list = #"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#
                let noSession = try await http.post(list, key: Desk.desk)
                #expect(noSession.status == .badRequest && noSession.body.contains("Mcp-Session-Id"))
                let unknown = try await http.post(list, key: Desk.desk, session: "0123456789abcdef")
                #expect(unknown.status == .notFound)

                // Two initializes from two clients: both work (the audit found every later one refused).
                let mine = try await http.open(key: Desk.reader)
                let second = try await http.open(key: Desk.reader)
                #expect(mine.session != second.session)

                // A support key presenting a read session's id is not that session.
                let stolen = try await http.post(
                    MCPHTTP.call(3, "add_account_note", #"{"accountId":"u1","text":"x"}"#), key: Desk.desk,
                    session: mine.session)
                #expect(stolen.status == .notFound)
                #expect(try await http.toolNames(key: Desk.reader, session: mine.session).contains("get_account"))

                let get = try await http.post("", key: Desk.reader, session: mine.session, method: .GET)
                #expect(get.status == .methodNotAllowed)

                let garbage = try await http.post(
                    #"{"jsonrpc":"2.0","id":5,"method":"#, key: Desk.reader,
                    session: mine.session)
                #expect(garbage.status == .badRequest)
                #expect(
                    garbage.json["id"] is NSNull && (garbage.json["error"] as? [String: Any])?["code"] as? Int == -32700
                )

                // Re-initializing inside a session is refused; the session still works.
                let again = try await http.post(MCPHTTP.initialize(9), key: Desk.reader, session: mine.session)
                #expect(again.status == .badRequest)

                let ended = try await http.post("", key: Desk.reader, session: mine.session, method: .DELETE)
                #expect(ended.status == .ok)
                #expect(try await http.post(list, key: Desk.reader, session: mine.session).status == .notFound)
                #expect(try await http.toolNames(key: Desk.reader, session: second.session).contains("get_account"))
            }
        }
    }

    /// An idle session ends by itself; a `Host` the listener was not told to answer is refused
    /// (DNS rebinding), one it was told is answered. Idle time is the listener's clock, moved
    /// here by hand: nothing depends on how fast the machine is.
    @Test func idleSessionsExpireAndHostIsChecked() async throws {
        let offset = ClockOffset()
        try await Desk.withLiveDesk("sqlite") { _, url, _ in
            let desk = SupportDesk(serverURL: url)
            try await desk.httpApplication(
                host: "127.0.0.1", port: 0, allowedHosts: ["desk.example.com"], sessionIdleTimeout: .seconds(600),
                clock: { ContinuousClock.now + offset.value }
            ).test(.live) { client in
                let evil = MCPHTTP(client: client, host: "evil.example.net")
                let refused = try await evil.post(MCPHTTP.initialize(1), key: Desk.reader)
                #expect(refused.status.code == 421 || refused.status == .forbidden, "\(refused.status)")
                #expect(refused.session == nil)

                let http = MCPHTTP(client: client, host: "desk.example.com")
                let opened = try await http.open(key: Desk.reader)
                let initialized = #"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
                // Used within its idle time: kept.
                offset.add(.seconds(500))
                #expect(try await http.post(initialized, key: Desk.reader, session: opened.session).status == .accepted)
                // Idle past it: ended.
                offset.add(.seconds(601))
                #expect(try await http.post(initialized, key: Desk.reader, session: opened.session).status == .notFound)
            }
        }
    }

    /// The official MCP Python SDK's client (PyPI `mcp`): two sessions at once with a read and a
    /// support key. Runs where `python3 -c "import mcp"` works (CI installs it); elsewhere it is
    /// skipped, by name, in the output.
    @Test(
        .enabled(
            if: MCPSessionTests.pythonSDK
                || ProcessInfo.processInfo.environment["STOREKEEPER_TEST_REQUIRE_PYTHON_MCP"] != nil,
            "the MCP Python SDK is not installed (pip install mcp)"))
    func theOfficialPythonClientWorksWithTwoKeysAtOnce() async throws {
        try await Desk.withLiveDesk("sqlite") { app, url, _ in
            let desk = SupportDesk(serverURL: url)
            try await desk.httpApplication(host: "127.0.0.1", port: 0).test(.live) { client in
                let before = try await Desk.coins(app, "u1")
                let out = FileManager.default.temporaryDirectory.appendingPathComponent("mcp-py-\(UUID()).json")
                defer { try? FileManager.default.removeItem(at: out) }
                let script = TrustTests.fixtures.appendingPathComponent("mcp_python_client.py").path
                let status = await Spawn.run([
                    "/usr/bin/env", "python3", script, "http://127.0.0.1:\(client.port!)/mcp", Desk.reader, Desk.desk,
                    "u1", out.path,
                ])
                #expect(status == 0)
                let report =
                    try JSONSerialization.jsonObject(with: try Data(contentsOf: out)) as? [String: Any] ?? [:]
                #expect(report["serverName"] as? String == "storekeeper")
                let readerTools = Set(report["readerTools"] as? [String] ?? [])
                #expect(readerTools.contains("get_account") && readerTools.isDisjoint(with: Desk.writeTools))
                #expect(Set(report["supportTools"] as? [String] ?? []).isSuperset(of: Desk.writeTools))
                #expect((report["readerCredit"] as? [String: Any])?["isError"] as? Bool == true)
                #expect((report["supportNote"] as? [String: Any])?["isError"] as? Bool == false, "\(report)")
                #expect((report["readerAccount"] as? [String: Any])?["isError"] as? Bool == false)
                #expect(try await Desk.coins(app, "u1") == before)
                let notes = try await app.store.accounts.notes(of: "u1")
                #expect(notes.map(\.author) == ["operator:support-desk (support, mcp)"])
            }
        }
    }

    static let pythonSDK: Bool = {
        var pid = pid_t()
        let words: [String] = ["/usr/bin/env", "python3", "-c", "import mcp.client.streamable_http"]
        let argv = words.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        guard posix_spawn(&pid, "/usr/bin/env", nil, nil, argv, environ) == 0 else { return false }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        return status == 0
    }()
}

extension MCPSessionTests {
    /// MCP's hints as a client reads them: what takes something away is destructive, what adds
    /// again on a second call (a note, an extension, a grant) is not idempotent.
    @Test func toolAnnotationsSayWhatEachWriteDoes() {
        let tools = Dictionary(
            uniqueKeysWithValues: SupportDesk.tools(for: KeyIdentity(label: "x", scope: "admin", apps: nil)).map {
                ($0.name, $0)
            })
        for name in ["refund_purchase", "debit_balance", "transfer_purchase", "end_grant"] {
            #expect(tools[name]?.annotations.destructiveHint == true, "\(name)")
        }
        for name in ["credit_balance", "add_account_note", "grant_entitlement", "extend_subscription"] {
            #expect(tools[name]?.annotations.destructiveHint == false, "\(name)")
        }
        for name in ["add_account_note", "extend_subscription", "grant_entitlement"] {
            #expect(tools[name]?.annotations.idempotentHint == false, "\(name)")
        }
        for name in ["credit_balance", "debit_balance", "refund_purchase"] {
            #expect(tools[name]?.annotations.idempotentHint == true, "\(name)")
        }
        #expect(tools["get_account"]?.annotations.readOnlyHint == true)
    }
}

/// Time added to the monotonic clock by a test.
final class ClockOffset: @unchecked Sendable {
    private let lock = NSLock()
    private var added: Duration = .zero
    var value: Duration { lock.withLock { added } }
    func add(_ more: Duration) { lock.withLock { added += more } }
}
