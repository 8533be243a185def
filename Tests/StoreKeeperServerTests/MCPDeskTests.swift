import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import MCP
import NIOCore
import StoreKeeperMCP
import SystemPackage
import Testing

@testable import StoreKeeperServer

/// `storekeeper mcp`: the SDK's own client drives the desk (in memory, over real stdio pipes and
/// over the streamable HTTP listener) against a live server on a real database; each tool is
/// offered by the key's scope, writes land and are audited under the key's label, and a read key
/// can change nothing.
@Suite struct MCPDeskTests {
    typealias API = ServerAPITests
    static let reader = KeyScopeTests.reader
    static let desk = KeyScopeTests.desk
    static let writeTools: Set<String> = [
        "credit_balance", "debit_balance", "grant_entitlement", "end_grant", "refund_purchase", "transfer_purchase",
        "extend_subscription", "add_account_note", "resolve_anomaly",
    ]

    /// A live server with a read and a support key, one coin purchase delivered to `u1`.
    static func withLiveDesk(
        _ kind: String, _ body: @Sendable (StoreKeeperApp, URL, String) async throws -> Void
    ) async throws {
        try await API.withServer(
            kind,
            configure: {
                $0.port = 0
                $0.operatorKeys = [
                    OperatorKey(label: "bi-dashboard", scope: .read, secret: reader),
                    OperatorKey(label: "support-desk", scope: .support, secret: desk),
                ]
            }
        ) { app, _ in
            try await app.application().test(.live) { client in
                let bought = try await app.localAppStore!.buy("p", items: [.init(productId: "coins_60")])
                let submitted = try await API.submit(
                    client, account: "u1", signedTransaction: bought.signedTransactions[0])
                #expect(submitted.status == .ok)
                let id = try #require(bought.transactions.first?.transactionId)
                try await body(app, URL(string: "http://127.0.0.1:\(client.port!)")!, id)
            }
        }
    }

    static func connect(_ desk: SupportDesk, key: String) async throws -> Client {
        let server = await desk.makeServer(key: key)
        let (clientSide, serverSide) = await InMemoryTransport.createConnectedPair()
        try await server.start(transport: serverSide)
        let client = Client(name: "desk-test", version: "1")
        _ = try await client.connect(transport: clientSide)
        return client
    }

    static func text(_ content: [Tool.Content]) -> String {
        content.compactMap { if case .text(let text, _, _) = $0 { text } else { nil } }.joined()
    }

    static func coins(_ app: StoreKeeperApp, _ account: String) async throws -> Int {
        Int(try await app.store.accounts.account(account).balances["coins"] ?? 0)
    }

    @Test(arguments: API.databases)
    func aSupportKeyCreditsGrantsAndLooksUpAndEveryWriteIsAudited(kind: String) async throws {
        try await Self.withLiveDesk(kind) { app, url, transactionId in
            let client = try await Self.connect(SupportDesk(serverURL: url), key: Self.desk)
            let names = Set(try await client.listTools().tools.map(\.name))
            #expect(names.isSuperset(of: Self.writeTools))
            #expect(names.isSuperset(of: ["find_transaction", "get_account", "analytics", "list_anomalies"]))

            let credit: [String: Value] = [
                "accountId": "u1", "currency": "coins", "amount": 40, "reason": "ticket 12: lost coins",
                "idempotencyKey": "t-12",
            ]
            let first = try await client.callTool(name: "credit_balance", arguments: credit)
            #expect(first.isError == false, "\(Self.text(first.content))")
            #expect(Self.text(first.content).contains("100"))
            // The agent retries: the idempotency key credits once.
            let again = try await client.callTool(name: "credit_balance", arguments: credit)
            #expect(again.isError == false)
            #expect(try await Self.coins(app, "u1") == 100)
            let audit = try await app.store.anomalies.audit().filter { $0.action == "balance_credited" }
            #expect(audit.count == 1)
            #expect(audit.first?.actor == "operator:support-desk (support, mcp)")
            // Told apart from the dashboard's and the API's, as the dashboard's say "(dashboard)".
            #expect(audit.first?.detail.contains("ticket 12: lost coins (mcp)") == true, "\(audit)")

            // A reason at the API's length in Unicode scalars (each character two: e + U+0301) still
            // fits once marked: the mark is made room for by whole characters.
            let accented = String(repeating: "e\u{301}", count: 249)
            let long = try await client.callTool(
                name: "credit_balance",
                arguments: [
                    "accountId": "u1", "currency": "coins", "amount": 1, "reason": .string(accented),
                    "idempotencyKey": "t-long",
                ])
            #expect(long.isError == false, "\(Self.text(long.content))")
            let marked = try await app.store.anomalies.audit().filter { $0.action == "balance_credited" }
            // 247 whole characters (494 scalars) and " (mcp)": 500.
            #expect(
                marked.contains {
                    $0.detail.hasSuffix("e\u{301} (mcp)")
                        && $0.detail.unicodeScalars.filter { $0 == "\u{301}" }.count == 247
                }, "\(marked.map(\.detail))")
            #expect(try await Self.coins(app, "u1") == 101)

            // Look-ups by any id, the account view.
            let found = try await client.callTool(name: "find_transaction", arguments: ["id": .string(transactionId)])
            #expect(
                found.isError == false && Self.text(found.content).contains("\"u1\""), "\(Self.text(found.content))")
            let account = try await client.callTool(name: "get_account", arguments: ["accountId": "u1"])
            #expect(Self.text(account.content).contains("\"coins\""))

            // A typo is the API's 400 naming the valid ids; nothing is granted.
            let typo = try await client.callTool(
                name: "grant_entitlement", arguments: ["accountId": "u1", "entitlement": "pr0", "days": 7])
            #expect(typo.isError == true)
            #expect(Self.text(typo.content).contains("unknown_entitlement"), "\(Self.text(typo.content))")
            let grant = try await client.callTool(
                name: "grant_entitlement",
                arguments: ["accountId": "u1", "entitlement": "pro", "days": 7, "note": "ticket 13"])
            #expect(grant.isError == false, "\(Self.text(grant.content))")
            #expect(try await app.store.accounts.account("u1").entitlements.contains { $0.entitlementId == "pro" })

            // Arguments that do not fit are the tool's error, not a crash, and nothing is called.
            let unknown = try await client.callTool(
                name: "credit_balance", arguments: credit.merging(["amout": 5]) { $1 })
            #expect(unknown.isError == true && Self.text(unknown.content).contains("amout"))
            let missing = try await client.callTool(name: "credit_balance", arguments: ["accountId": "u1"])
            #expect(missing.isError == true)
            let noSuchTool = try await client.callTool(name: "drop_tables", arguments: [:])
            #expect(noSuchTool.isError == true)
            #expect(try await Self.coins(app, "u1") == 101)

            // A note, then an App Store refund is Apple's (the API's 422 as the tool's error).
            let note = try await client.callTool(
                name: "add_account_note", arguments: ["accountId": "u1", "text": "called twice", "ticket": "T-12"])
            #expect(note.isError == false)
            let refund = try await client.callTool(
                name: "refund_purchase", arguments: ["id": .string(transactionId), "reason": "asked"])
            #expect(refund.isError == true && Self.text(refund.content).contains("refunded_by_apple_only"))
        }
    }

    /// The real stdio transport over pipes: a read key is offered no write tool and a write it
    /// asks for anyway changes nothing.
    @Test(arguments: API.databases)
    func aReadKeyOverStdioIsOfferedNoWriteAndCannotWrite(kind: String) async throws {
        try await Self.withLiveDesk(kind) { app, url, transactionId in
            let desk = SupportDesk(serverURL: url)
            let toServer = try FileDescriptor.pipe()
            let toClient = try FileDescriptor.pipe()
            let serving = Task {
                try await desk.serveStdio(
                    key: Self.reader, input: toServer.readEnd, output: toClient.writeEnd)
            }
            let client = Client(name: "desk-test", version: "1")
            _ = try await client.connect(
                transport: StdioTransport(input: toClient.readEnd, output: toServer.writeEnd))
            let names = Set(try await client.listTools().tools.map(\.name))
            #expect(names.isDisjoint(with: Self.writeTools), "\(names)")
            #expect(names.contains("find_transaction") && names.contains("analytics"))

            let write = try await client.callTool(
                name: "credit_balance",
                arguments: [
                    "accountId": "u1", "currency": "coins", "amount": 1000, "reason": "free coins",
                    "idempotencyKey": "x",
                ])
            #expect(write.isError == true)
            #expect(Self.text(write.content).contains("read"), "\(Self.text(write.content))")
            #expect(try await Self.coins(app, "u1") == 60)
            #expect(try await app.store.anomalies.audit().allSatisfy { $0.action != "balance_credited" })

            let found = try await client.callTool(name: "find_transaction", arguments: ["id": .string(transactionId)])
            #expect(found.isError == false)
            let mrr = try await client.callTool(name: "analytics", arguments: ["metric": "mrr"])
            #expect(mrr.isError == false, "\(Self.text(mrr.content))")

            await client.disconnect()
            try toServer.writeEnd.close()
            serving.cancel()
            _ = try? await serving.value
            for descriptor in [toServer.readEnd, toClient.readEnd, toClient.writeEnd] { try? descriptor.close() }

            // A key the server refuses is an error before anything is served.
            await #expect(throws: DeskError.self) {
                try await desk.serveStdio(key: "sk_not_a_key_0123456789abcdefghijklmn")
            }
        }
    }

    /// A client that writes its requests and closes stdin at once (a script piping a file in)
    /// gets every answer: the desk ends when the last one is written, not at EOF.
    @Test func requestsWrittenBeforeStdinClosesAreAllAnswered() async throws {
        try await Self.withLiveDesk("sqlite") { _, url, transactionId in
            let desk = SupportDesk(serverURL: url)
            let toServer = try FileDescriptor.pipe()
            let toClient = try FileDescriptor.pipe()
            var lines = [
                #"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"script","version":"1"}}}"#,
                #"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                #"{"jsonrpc":"2.0","id":"list","method":"tools/list"}"#,
            ]
            for index in 1...6 {
                lines.append(
                    #"{"jsonrpc":"2.0","id":\#(index),"method":"tools/call","params":{"name":"find_transaction","arguments":{"id":"\#(transactionId)"}}}"#
                )
            }
            lines.append(
                #"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_account","arguments":{"accountId":"u1"}}}"#
            )
            let bytes = Array((lines.joined(separator: "\n") + "\n").utf8)
            _ = try bytes.withUnsafeBytes { try toServer.writeEnd.writeAll($0) }
            try toServer.writeEnd.close()
            // Everything is written and stdin is closed before the desk reads a byte.
            try await desk.serveStdio(key: Self.reader, input: toServer.readEnd, output: toClient.writeEnd)
            try toClient.writeEnd.close()
            var output: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while true {
                let count = try buffer.withUnsafeMutableBytes { try toClient.readEnd.read(into: $0) }
                if count == 0 { break }
                output += buffer[..<count]
            }
            for descriptor in [toServer.readEnd, toClient.readEnd] { try? descriptor.close() }
            var answered: [String: [String: Any]] = [:]
            for line in String(decoding: output, as: UTF8.self).split(separator: "\n") {
                guard let message = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                    continue
                }
                answered["\(message["id"] ?? "none")"] = message
            }
            #expect(Set(answered.keys) == ["0", "list", "1", "2", "3", "4", "5", "6", "7"], "\(answered.keys)")
            for index in 1...7 {
                let result = answered["\(index)"]?["result"] as? [String: Any]
                #expect(result?["isError"] as? Bool != true, "\(answered["\(index)"] ?? [:])")
            }
        }
    }

    /// Streamable HTTP: `initialize` with a key opens a session bound to it; none or a wrong key is
    /// 401; each session is offered its own key's tools and calls with its own key.
    @Test func theHTTPListenerServesEachKeyItsOwnTools() async throws {
        try await Self.withLiveDesk("sqlite") { app, url, _ in
            let desk = SupportDesk(serverURL: url)
            try await desk.httpApplication(host: "127.0.0.1", port: 0).test(.live) { client in
                let http = MCPHTTP(client: client)
                let anonymous = try await http.post(MCPHTTP.initialize(1), key: nil)
                #expect(anonymous.status == .unauthorized)
                #expect(anonymous.headers.first(name: "WWW-Authenticate")?.hasPrefix("Bearer") == true)
                #expect(
                    try await http.post(MCPHTTP.initialize(1), key: "sk_wrong_0123456789abcdefghijklmnopq").status
                        == .unauthorized)

                let reader = try await http.open(key: Self.reader)
                let support = try await http.open(key: Self.desk)
                #expect(reader.session != support.session)
                #expect(
                    ((reader.hello["result"] as? [String: Any])?["serverInfo"] as? [String: Any])?["name"] as? String
                        == "storekeeper")
                let readTools = try await http.toolNames(key: Self.reader, session: reader.session)
                #expect(readTools.contains("get_account") && readTools.isDisjoint(with: Self.writeTools))
                #expect(
                    try await http.toolNames(key: Self.desk, session: support.session).isSuperset(of: Self.writeTools))

                let call = MCPHTTP.call(3, "add_account_note", #"{"accountId":"u1","text":"via http"}"#)
                let refused = try await http.post(call, key: Self.reader, session: reader.session)
                #expect((refused.json["result"] as? [String: Any])?["isError"] as? Bool == true)
                let written = try await http.post(call, key: Self.desk, session: support.session)
                #expect((written.json["result"] as? [String: Any])?["isError"] as? Bool == false, "\(written.json)")
                let notes = try await app.store.accounts.notes(of: "u1")
                #expect(notes.count == 1 && notes.first?.author == "operator:support-desk (support, mcp)")
            }
        }
    }

    /// The StoreKeeper server not answering is an answer: 503 with Retry-After over HTTP, the
    /// tool's error in memory — never a hang past the call's deadline.
    @Test func anUnreachableServerIsAnAnswerNotAHang() async throws {
        let desk = SupportDesk(serverURL: URL(string: "http://127.0.0.1:1")!, callTimeout: .seconds(5))
        try await desk.httpApplication(host: "127.0.0.1", port: 0).test(.live) { client in
            var headers: HTTPFields = [
                .contentType: "application/json", .accept: "application/json", .authorization: "Bearer \(Self.desk)",
            ]
            headers[HTTPField.Name("Host")!] = "127.0.0.1:\(client.port!)"
            let status = try await client.execute(
                uri: "/mcp", method: .post, headers: headers,
                body: ByteBuffer(string: #"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
            ) { ($0.status, $0.headers[.retryAfter]) }
            #expect(status.0 == .serviceUnavailable && status.1 != nil, "\(status)")
        }
        let result = await desk.call("get_account", arguments: ["accountId": "u1"], key: Self.desk)
        #expect(result.isError == true && Self.text(result.content).contains("did not answer"))
    }
}
