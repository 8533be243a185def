import AppStoreModels
import AppStoreVerification
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Mustache
import NIOCore
import StoreKeeperCore
import StoreKeeperStorage
import StoreKeeperSupport
import Synchronization
import Testing

@testable import StoreKeeperServer

/// The second outside audit (issue 31): each finding's regression test, on the real server and
/// database (SQLite, and PostgreSQL when configured) wherever storage is involved. Each failed
/// on the code the audit read (2c8e057).
@Suite struct SecondAuditTests {
    typealias API = ServerAPITests

    /// The audit's strings: each is one `Character` holding a delimiter (a prepended
    /// concatenation mark before it, or a combining accent after it), which a per-`Character`
    /// table lookup never matches.
    static let hostile = [
        "\u{600}<meta http-equiv=refresh content=0;url=//evil.example/p>\u{301}", "\u{600}<", ">\u{301}",
        "\"\u{301}", "'\u{301}",
    ]

    // MARK: 1. Stored HTML injection

    @Test func theEscaperWorksOnBytesNotCharacters() {
        for text in Self.hostile + ["<b>&\"'</b>", "plain", ""] {
            let escaped = HTMLEscaping.escape(text)
            for delimiter in ["<", ">", "\"", "'"] {
                #expect(!escaped.unicodeScalars.contains(Unicode.Scalar(delimiter)!), "\(escaped.debugDescription)")
            }
            // Every `&` starts one of the five entities: nothing else was touched.
            var restored = escaped
            for (entity, raw) in [("&lt;", "<"), ("&gt;", ">"), ("&quot;", "\""), ("&#39;", "'"), ("&amp;", "&")] {
                restored = restored.replacingOccurrences(of: entity, with: raw, options: .literal)
            }
            #expect(restored.utf8.elementsEqual(text.utf8))
            #expect(BarChart.escape(text) == escaped)
        }
    }

    /// The bug reported upstream (README, "dependencies used differently"): swift-mustache
    /// 2.1.1's own HTML escaper lets a delimiter through when it shares a grapheme cluster.
    /// When this test fails, upstream fixed it; the dashboard does not depend on it either way.
    @Test func swiftMustachesOwnEscaperLetsGraphemeClustersThrough() throws {
        let template = try MustacheTemplate(string: "<p>{{x}}</p>")
        let rendered = template.render(["x": "\u{600}<meta>"])
        #expect(rendered.contains("<meta"), "upstream's escaper now escapes per scalar: \(rendered)")
        _ = DashboardController.library  // registers the content type
        let safe = try MustacheTemplate(string: HTMLEscaping.ContentType.pragma + "<p>{{x}}</p>")
        #expect(!safe.render(["x": "\u{600}<meta>"]).contains("<meta"))
    }

    static let placeholder = "QQPLACEHOLDERQQ"

    /// Values for every name a template uses: variables are `value`; sections are `true`, or (the
    /// second rendering) a list of `value`, so `{{.}}` inside them renders it too.
    static func values(for template: String, value: String, listSections: Bool) -> [String: Any] {
        let pattern = try! NSRegularExpression(pattern: #"\{\{(?!\{)\s*([#^/]?)\s*([A-Za-z0-9_]+)\s*\}\}"#)
        var variables = Set<String>()
        var sections = Set<String>()
        for match in pattern.matches(in: template, range: NSRange(template.startIndex..., in: template)) {
            let kind = String(template[Range(match.range(at: 1), in: template)!])
            let name = String(template[Range(match.range(at: 2), in: template)!])
            if kind.isEmpty { variables.insert(name) } else { sections.insert(name) }
        }
        var values: [String: Any] = [:]
        for name in sections {
            // A section that renders `{{.}}` always gets a list (`true` would render the context).
            let body =
                template.components(separatedBy: "{{#\(name)}}").dropFirst().first?
                .components(separatedBy: "{{/\(name)}}").first ?? ""
            values[name] = listSections || body.contains("{{.}}") ? [value] : true
        }
        for name in variables { values[name] = value }
        return values
    }

    /// Every template and chart, rendered with every value set to each hostile string: the result
    /// is exactly the one with a placeholder, with the placeholder replaced by the string escaped
    /// — so every value went through the scalar-safe escaper, in text and attribute contexts alike.
    static func renderedPages() -> [(name: String, placeholder: String, hostile: [String])] {
        func chart(_ text: String) -> String {
            BarChart(
                title: "Chart \(text)", labels: [text, "b"],
                series: [.init(name: "n", cssClass: "s1", values: [3, 1])]
            ).svg()
        }
        func page(_ name: String, _ text: String, listSections: Bool) -> String {
            let templateText = DashboardTemplates.all[name]!
            var values = Self.values(for: templateText, value: text, listSections: listSections)
            values["svg"] = chart(text)
            if name == "overview", listSections {
                values["charts"] = [
                    DashboardController.chart(
                        BarChart(
                            title: text, labels: [text], series: [.init(name: "n", cssClass: "s1", values: [1])]),
                        labelHeader: text)
                ]
            }
            let body = DashboardController.library.render(values, withTemplate: name) ?? ""
            var layout = Self.values(for: DashboardTemplates.layout, value: text, listSections: false)
            layout["body"] = body
            return DashboardController.library.render(layout, withTemplate: "layout") ?? ""
        }
        var pages: [(String, String, [String])] = []
        for name in DashboardTemplates.all.keys.sorted() where name != "layout" {
            for listSections in [false, true] {
                pages.append(
                    (
                        "\(name)-\(listSections ? "lists" : "flags")",
                        page(name, placeholder, listSections: listSections),
                        hostile.map { page(name, $0, listSections: listSections) }
                    ))
            }
        }
        return pages
    }

    @Test func everyTemplateAndChartEscapesEveryValue() {
        _ = DashboardController.library
        for (name, placeholder, pages) in Self.renderedPages() {
            #expect(placeholder.contains(Self.placeholder), "\(name) renders its values")
            for (text, rendered) in zip(Self.hostile, pages) {
                let expected = placeholder.replacingOccurrences(of: Self.placeholder, with: HTMLEscaping.escape(text))
                if rendered != expected {
                    let a = Array(rendered.utf8)
                    let b = Array(expected.utf8)
                    let at = (0..<min(a.count, b.count)).first { a[$0] != b[$0] } ?? min(a.count, b.count)
                    Issue.record(
                        "\(name) with \(text.debugDescription) differs at byte \(at): \(String(decoding: a[max(0, at - 80)..<min(a.count, at + 80)], as: UTF8.self).debugDescription) vs \(String(decoding: b[max(0, at - 80)..<min(b.count, at + 80)], as: UTF8.self).debugDescription)"
                    )
                }
            }
        }
    }

    /// The same pages in a real browser (`Tests/Browser/escaping_test.py`, Debian's chromium):
    /// no page navigates, no element is added, every hostile string is there as text.
    @Test func everyTemplateEscapesEveryValueInARealBrowser() async throws {
        _ = DashboardController.library
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("escaping-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var manifest: [[String: Any]] = []
        for (name, placeholder, pages) in Self.renderedPages() {
            try placeholder.write(
                to: directory.appendingPathComponent("\(name).placeholder.html"), atomically: true, encoding: .utf8)
            for (index, page) in pages.enumerated() {
                try page.write(
                    to: directory.appendingPathComponent("\(name).hostile-\(index).html"), atomically: true,
                    encoding: .utf8)
                manifest.append([
                    "page": "\(name).hostile-\(index).html", "placeholder": "\(name).placeholder.html",
                    "text": Self.hostile[index], "marker": Self.placeholder,
                ])
            }
        }
        try JSONSerialization.data(withJSONObject: manifest).write(to: directory.appendingPathComponent("pages.json"))
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let python = ChildProcess()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        python.arguments = [
            "python3", root.appendingPathComponent("Tests/Browser/escaping_test.py").path, "--pages", directory.path,
        ]
        let output = Pipe()
        python.standardOutput = output
        python.standardError = output
        try python.run()
        // Read on a thread of its own, awaited: blocking here would hold one of the test
        // process's few cooperative threads (two on two cores) for the browser's whole run.
        let log: Data = try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                let log = output.fileHandleForReading.readDataToEndOfFile()
                python.waitUntilExit()
                continuation.resume(returning: log)
            }
        }
        let text = String(decoding: log, as: UTF8.self)
        if python.terminationStatus == 77 {
            if ProcessInfo.processInfo.environment["CI"] != nil {
                Issue.record(Comment(rawValue: "the escaping browser test needs chromium and selenium: \(text)"))
            }
            return
        }
        #expect(python.terminationStatus == 0, Comment(rawValue: text))
        #expect(text.contains("all escaping browser checks passed"), Comment(rawValue: text))
    }

    @Test(arguments: API.databases)
    func appTransactionIdIsDigitsAndAnomalyDetailsQuoteClientText(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            // The audit's attack: refused at the door.
            for bad in [Self.hostile[0], "12a", "١٢٣", "1\u{301}", "", String(repeating: "7", count: 65)] {
                let body = try JSONSerialization.data(withJSONObject: [
                    "accountId": "mallory", "productId": "coins_60", "appTransactionId": bad,
                ])
                let reply = try await API.call(
                    client, .post, "/v1/orders", body: String(decoding: body, as: UTF8.self))
                #expect(reply.status == .badRequest, "\(bad.debugDescription)")
            }
            // Hostile account ids sharing one Apple Account: the anomaly's detail quotes them.
            for (index, text) in Self.hostile.enumerated() {
                let body = try JSONSerialization.data(withJSONObject: [
                    "accountId": "acct\(index)\(text)", "productId": "coins_60", "appTransactionId": "7050001",
                ])
                let reply = try await API.call(
                    client, .post, "/v1/orders", body: String(decoding: body, as: UTF8.self))
                #expect(reply.status == .created, "\(reply.json)")
            }
            let anomalies = try await app.store.anomalies.anomalies(status: "open").filter {
                $0.kind == "shared_apple_id"
            }
            let detail = try #require(anomalies.first?.detail)
            #expect(anomalies.count == 1)
            #expect(detail.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) }, "\(detail)")
            #expect(!detail.contains("<") && !detail.contains(">") && !detail.contains("'"), "\(detail)")
            #expect(detail.contains(#""acct0\u{600}\u{3c}meta"#), "\(detail)")
        }
    }

    // MARK: 2. Ids compared as the database compares them

    @Test func callersAndThePlannerCompareIdsByteWise() {
        let pairs = [("\u{212A}ate", "Kate"), ("jose\u{301}", "jos\u{E9}"), ("a\u{37E}b", "a;b")]
        for (lhs, rhs) in pairs {
            #expect(lhs == rhs, "Swift's == is canonical equivalence")
            #expect(!Identifiers.same(lhs, rhs))
            #expect(!Caller.account(lhs).mayActOn(rhs))
            #expect(!Caller.account(rhs).mayActOn(lhs))
            #expect(Caller.account(rhs).mayActOn(rhs))
            #expect(!Identifiers.isNFC(lhs) || !Identifiers.isNFC(rhs))
        }
        #expect(Identifiers.isNFC("Kate") && Identifiers.isNFC("jos\u{E9}") && Identifiers.isNFC("用户-42"))
        #expect(!Identifiers.isNFC("\u{212A}ate") && !Identifiers.isNFC("jose\u{301}") && !Identifiers.isNFC("\u{37E}"))
    }

    @Test(arguments: API.databases)
    func aCanonicallyEquivalentIdNeverReachesAnotherAccount(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let created = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"Kate","productId":"coins_60"}"#)
            #expect(created.status == .created)
            let kateOrder = try #require(created.json["orderId"] as? String)
            let jose = try await API.call(
                client, .post, "/v1/orders", body: #"{"accountId":"jos\u00e9","productId":"coins_60"}"#)
            #expect(jose.status == .created)
            let joseOrder = try #require(jose.json["orderId"] as? String)
            // Tokens whose `sub` is canonically equal to Kate, José and "a;b" but not byte-equal.
            for (look, owner, order) in [
                ("\u{212A}ate", "Kate", kateOrder), ("jose\u{301}", "jos\u{E9}", joseOrder), ("a\u{37E}b", "a;b", nil),
            ] {
                let token = try await API.clientToken(look)
                let path = "/v1/accounts/\(owner.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)"
                let read = try await API.call(client, .get, path, token: token)
                #expect(read.status == .badRequest, "\(look.debugDescription): \(read.json)")
                if let order {
                    let orderRead = try await API.call(client, .get, "/v1/orders/\(order)", token: token)
                    #expect(orderRead.status == .badRequest && orderRead.json["appAccountToken"] == nil)
                }
                let body = try JSONSerialization.data(withJSONObject: ["accountId": owner, "productId": "coins_60"])
                let create = try await API.call(
                    client, .post, "/v1/orders", token: token, body: String(decoding: body, as: UTF8.self))
                #expect(create.status == .badRequest)
                // The same ids from a secret key, in a body or a path: 400, one spelling per id.
                let spelled = try JSONSerialization.data(withJSONObject: ["accountId": look, "productId": "coins_60"])
                let bySecret = try await API.call(
                    client, .post, "/v1/orders", body: String(decoding: spelled, as: UTF8.self))
                #expect(bySecret.status == .badRequest && (bySecret.errorMessage ?? "").contains("NFC"))
                let pathLook = look.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
                #expect(try await API.call(client, .get, "/v1/accounts/\(pathLook)").status == .badRequest)
            }
            // The owner's own token still works, and Kate has exactly her one order.
            let kate = try await API.clientToken("Kate")
            #expect(try await API.call(client, .get, "/v1/orders/\(kateOrder)", token: kate).status == .ok)
            #expect(try await app.store.reports.accountRecords("Kate").orders.count == 1)
            #expect(try await app.store.reports.accountRecords("\u{212A}ate").orders.isEmpty)
        }
    }

    // MARK: 3. Prepared statements behind a transaction-mode pooler

    /// Two instances (each its own statement names) on one database through PgBouncer in
    /// transaction mode (`.ci/run` starts Debian's 1.18 and sets STOREKEEPER_TEST_PGBOUNCER_URL):
    /// no request fails, the open-order cap holds for every account, every order is read back as
    /// written, and no statement of one instance ever runs for the other.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["STOREKEEPER_TEST_PGBOUNCER_URL"] != nil))
    func twoInstancesBehindPgBouncerInTransactionMode() async throws {
        let environment = ProcessInfo.processInfo.environment
        let direct = try #require(environment["STOREKEEPER_TEST_POSTGRES_URL"])
        let pooled = try #require(environment["STOREKEEPER_TEST_PGBOUNCER_URL"])
        let lease = try await ScratchDatabases.shared.lend(base: direct)
        defer { Task { await ScratchDatabases.shared.giveBack(lease) } }
        var components = URLComponents(string: pooled)!
        components.path = "/\(lease.name)"
        var apps: [StoreKeeperApp] = []
        var directories: [URL] = []
        for _ in 0..<2 {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bouncer-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            directories.append(directory)
            try await SharedLocalPKI.seed(directory)
            var configuration = ServerConfiguration()
            configuration.databaseURL = components.string!
            configuration.secretKeys = [API.secret]
            configuration.clientTokenSecret = API.tokenSecret
            configuration.clientRequestsPerSecond = 100_000
            configuration.localAppStoreEnabled = true
            configuration.bundleId = "com.example.app"
            configuration.appAppleId = 1_234_567_890
            configuration.maxOpenOrdersPerAccount = 6
            apps.append(try await StoreKeeperApp.make(configuration, dataDirectory: directory))
        }
        defer { for directory in directories { try? FileManager.default.removeItem(at: directory) } }
        let (first, second) = (apps[0], apps[1])
        try await API.drive(first) { _, one in
            try await API.drive(second) { _, two in
                let clients: [any TestClientProtocol] = [one, two]
                // 12 accounts at once; each account's requests alternate between the instances.
                let results = try await withThrowingTaskGroup(of: (String, [Int], Int).self) { group in
                    for account in 0..<12 {
                        group.addTask {
                            var statuses: [Int] = []
                            var readsRight = 0
                            for attempt in 0..<10 {
                                let client = clients[(account + attempt) % 2]
                                let created = try await API.call(
                                    client, .post, "/v1/orders",
                                    body: #"{"accountId":"acct-\#(account)","productId":"coins_60"}"#)
                                statuses.append(Int(created.status.code))
                                if let orderId = created.json["orderId"] as? String {
                                    let read = try await API.call(
                                        clients[(account + attempt + 1) % 2], .get, "/v1/orders/\(orderId)")
                                    if read.json["accountId"] as? String == "acct-\(account)" { readsRight += 1 }
                                }
                                let balance = try await API.call(client, .get, "/v1/accounts/acct-\(account)")
                                statuses.append(Int(balance.status.code))
                            }
                            return ("acct-\(account)", statuses, readsRight)
                        }
                    }
                    var all: [(String, [Int], Int)] = []
                    for try await result in group { all.append(result) }
                    return all
                }
                for (account, statuses, readsRight) in results {
                    #expect(!statuses.contains { $0 >= 500 }, "\(account): \(statuses)")
                    #expect(statuses.filter { $0 == 201 }.count == 6, "\(account): the cap is 6 (\(statuses))")
                    #expect(statuses.filter { $0 == 409 }.count == 4, "\(account): \(statuses)")
                    #expect(readsRight == 6)
                }
            }
        }
    }

    // MARK: 4. Rejected proofs within a bound

    @Test(arguments: API.databases)
    func randomProofsAreKeptAsTheirHashNotTheirBytes(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            var generator = SystemRandomNumberGenerator()
            for index in 0..<20 {
                let bytes = (0..<600_000).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let field = index % 2 == 0 ? "receipt" : "signedTransaction"
                let proof = index % 2 == 0 ? Data(bytes).base64EncodedString() : "eyJhbGciOiJFUzI1NiJ9.e30.\(index)"
                let reply = try await API.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"mallory","\#(field)":"\#(proof)"}"#)
                #expect(reply.status.code >= 400 && reply.status.code < 500, "\(reply.json)")
            }
            // A proof with a NUL: answered, and kept (as its hash) on PostgreSQL too.
            let nul = try await API.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"mallory","signedTransaction":"a\u0000b.c.d"}"#)
            #expect(nul.status.code >= 400 && nul.status.code < 500, "\(nul.json)")
            let kept = try await app.rejectedProofs.list(limit: 100, withProof: true)
            #expect(kept.count == 21)
            #expect(kept.allSatisfy { !$0.proofKept && $0.proof.isEmpty })
            let used = try await app.rejectedProofs.budgetUsed(now: Date())
            #expect(used.today > 0 && used.today < 21 * 1024, "\(used)")
            #expect(used.total == used.today)
        }
    }

    @Test(arguments: API.databases)
    func theBudgetDropsTheOldestUnverifiableProofsFirst(kind: String) async throws {
        try await API.withServer(kind) { app, _ in
            var store = RejectedProofStore(database: app.database, maxBytesPerDay: 4_000, maxBytesTotal: 6_000)
            store.maxPerAccountPerDay = 1_000
            let day = Date(timeIntervalSince1970: 1_800_000_000)
            func keep(_ proof: String, text: Bool, _ at: Date, account: String = "a") async throws
                -> RejectedProofStore.KeepResult
            {
                try await store.keep(
                    kind: .signedTransaction, proof: proof, keepText: text, code: "invalid_chain", reason: "r",
                    accountId: account, orderId: nil, serverVersion: "t", now: at)
            }
            // Yesterday: a re-verifiable proof (1,000 bytes of text) and digests.
            #expect(try await keep(String(repeating: "g", count: 1_000), text: true, day) == .kept)
            for index in 0..<6 { #expect(try await keep("old-\(index)", text: false, day) == .keptDigest) }
            // Today: the total (6,000) is reached; the oldest digests go first, the text stays.
            let today = day.addingTimeInterval(86_400)
            for index in 0..<20 { #expect(try await keep("new-\(index)", text: false, today) == .keptDigest) }
            let rows = try await store.list(limit: 1_000)
            #expect(rows.contains { $0.proofKept })
            #expect(rows.filter { $0.sha256 == RejectedProofStore.sha256("old-0") }.isEmpty)
            let used = try await store.budgetUsed(now: today)
            #expect(used.total <= 6_000 && used.today <= 4_000, "\(used)")
            // A proof larger than a day's budget is not kept at all; one that fits after drops is.
            #expect(try await keep(String(repeating: "h", count: 5_000), text: true, today) == .capped)
            #expect(try await keep(String(repeating: "i", count: 2_000), text: true, today) == .kept)
            let after = try await store.budgetUsed(now: today)
            #expect(after.total <= 6_000 && after.today <= 4_000, "\(after)")
            // The counts stay true through a retention prune.
            _ = try await store.prune(olderThan: 1, now: today.addingTimeInterval(3_600))
            let pruned = try await store.budgetUsed(now: today)
            let recount = try await store.list(limit: 1_000).count
            #expect(pruned.total == pruned.today && recount > 0)
        }
    }

    // MARK: The overload tail

    /// The listening socket accepts up to 256 connections per read (NIO's default is 4): under a
    /// flood of connections the accept queue drained at ~40/s and p99 was 8.9 s (BENCHMARKS.md).
    @Test func theListeningSocketAcceptsInBatches() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("accept-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await SharedLocalPKI.seed(directory)
        var configuration = ServerConfiguration()
        configuration.databaseURL = "sqlite:\(directory.path)/s.sqlite"
        configuration.secretKeys = [API.secret]
        configuration.bundleId = "com.example.app"
        configuration.appAppleId = 1
        configuration.port = 0
        let app = try await StoreKeeperApp.make(configuration, dataDirectory: directory)
        try await app.application().test(.live) { client in
            #expect(try await API.call(client, .get, "/healthz", token: nil).status.code < 600)
            let channel = try #require(app.listening.channel.withLock { $0 })
            #expect(try await channel.getOption(ChannelOptions.maxMessagesPerRead) == StoreKeeperApp.acceptBatch)
            #expect(StoreKeeperApp.acceptBatch >= 64)
        }
        try? await app.database.close()
    }

    // MARK: The audit's notes

    @Test func retentionRequestsInSandboxMustNameTheConfiguredApp() async throws {
        try await OfferTests.withRelay("sqlite") { relay in
            let (_, bought) = try await relay.buy("sandy", "pro_monthly")
            let original = try #require(bought.originalTransactionId)
            let other = try await RetentionTests.ask(
                relay,
                try await RetentionTests.request(relay, original: original, appAppleId: 99, environment: .sandbox))
            #expect(other.status == .badRequest && other.errorCode == "wrong_app", "\(other.json)")
            let own = try await RetentionTests.ask(
                relay, try await RetentionTests.request(relay, original: original, environment: .sandbox))
            #expect(own.status == .ok, "\(own.json)")
        }
    }

    @Test(arguments: API.databases)
    func anomalyListsArePaginated(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            for index in 0..<7 {
                try await app.store.anomalies.raiseAnomaly(
                    .init(
                        kind: .verificationStuck, transactionId: "\(index)", orderId: nil, accountId: "a", detail: "d"),
                    dedupeKey: AnomalyStore.dedupeKey("test", "\(index)"),
                    now: Date(timeIntervalSince1970: 1_800_000_000 + Double(index % 3)))
            }
            var seen: [String] = []
            var cursor: String?
            repeat {
                let query = "/v1/anomalies?status=open&limit=3" + (cursor.map { "&after=\($0)" } ?? "")
                let page = try await API.call(client, .get, query)
                #expect(page.status == .ok)
                let items = page.json["anomalies"] as? [[String: Any]] ?? []
                #expect(items.count <= 3)
                seen += items.compactMap { $0["transactionId"] as? String }
                cursor = page.json["nextCursor"] as? String
            } while cursor != nil
            #expect(seen.count == 7 && Set(seen).count == 7)
            for bad in ["limit=0", "limit=1001", "limit=x", "after=nope"] {
                #expect(try await API.call(client, .get, "/v1/anomalies?\(bad)").status == .badRequest, "\(bad)")
            }
            // The same parts, joined with `|` before, are two keys now.
            #expect(AnomalyStore.dedupeKey("k", "a|b", "c") != AnomalyStore.dedupeKey("k", "a", "b|c"))
            let parsed = try JSONSerialization.jsonObject(with: Data(AnomalyStore.dedupeKey("k", nil, "x\"\n").utf8))
            let parts = try #require(parsed as? [Any])
            #expect(
                parts.count == 3 && parts[0] as? String == "k" && parts[1] is NSNull && parts[2] as? String == "x\"\n")
        }
    }

    // MARK: 5. maxPerAccount counts signatures

    @Test(arguments: API.databases)
    func maxPerAccountCountsSignedOffersNotOnlyRedemptions(kind: String) async throws {
        try await OfferTests.withRelay(kind, configure: { $0.introductoryOffers = .oncePerAccount }) { relay in
            _ = try await OfferTests.subscribeThenLapse(relay, "zed")
            // `comeback` has maxPerAccount 1: one signature, then refused until it expires unredeemed.
            let first = try await OfferTests.order(relay, "zed", offer: "comeback")
            #expect(first.status == .created, "\(first.json)")
            for _ in 0..<3 {
                let again = try await OfferTests.order(relay, "zed", offer: "comeback")
                #expect(again.status == .forbidden && again.errorCode == "offer_not_eligible", "\(again.json)")
                #expect((again.errorMessage ?? "").contains("maxPerAccount"))
            }
            // Unlimited offers are signed as often as asked.
            #expect(try await OfferTests.order(relay, "zed", offer: "anyone").status == .created)
            #expect(try await OfferTests.order(relay, "zed", offer: "anyone").status == .created)
            // Redeemed: still one (the redemption), never a second signature.
            _ = try await OfferTests.pay(relay, appleId: "apple-zed", reply: first).get()
            #expect(try await OfferTests.order(relay, "zed", offer: "comeback").status == .forbidden)

            // once_per_account: one `allowed: true` at a time, whatever the Apple ID.
            let ids = [
                await relay.store.customer("apple-una-1").appTransactionId,
                await relay.store.customer("apple-una-2").appTransactionId,
            ]
            let allowed = try await OfferTests.order(relay, "una", appTransactionId: ids[0])
            #expect((allowed.json["introductoryOfferEligibility"] as? [String: Any])?["allowed"] as? Bool == true)
            let second = try await OfferTests.order(relay, "una", appTransactionId: ids[1])
            #expect((second.json["introductoryOfferEligibility"] as? [String: Any])?["allowed"] as? Bool == false)
        }
    }

    // MARK: 6. Dashboard sessions end on the server; sign-in is rate-limited

    @Test(arguments: API.databases)
    func signingOutEndsTheSessionOnTheServerAndEverywhere(kind: String) async throws {
        try await API.withServer(kind) { app, client in
            let browser = DashboardTests.Browser(client)
            _ = try await browser.post("/dashboard/login", ["key": API.secret])
            let kept = try #require(browser.cookie)
            let csrf = try #require(try await browser.get("/dashboard").csrf)
            let out = try await browser.post("/dashboard/logout", ["_csrf": csrf])
            #expect(out.status == .seeOther && out.location == "/dashboard/login")
            // The cookie someone copied before the sign-out: refused from now on.
            let replay = DashboardTests.Browser(client)
            replay.cookie = kept
            #expect(try await replay.get("/dashboard").location == "/dashboard/login")
            #expect(try await replay.get("/dashboard/anomalies").location == "/dashboard/login")
            #expect(try await replay.post("/dashboard/logout", ["_csrf": csrf]).status == .unauthorized)

            // "Sign out everywhere": every session of the key ends, on every instance (a second
            // app on the same database shares the table).
            let one = DashboardTests.Browser(client)
            let two = DashboardTests.Browser(client)
            _ = try await one.post("/dashboard/login", ["key": API.secret])
            _ = try await two.post("/dashboard/login", ["key": API.secret])
            #expect(try await two.get("/dashboard").status == .ok)
            // Sessions are stamped in whole seconds: the sign-out ends those issued up to its second.
            let everywhere = try await one.post(
                "/dashboard/logout-everywhere", ["_csrf": try #require(try await one.get("/dashboard").csrf)])
            #expect(everywhere.status == .seeOther)
            #expect(try await two.get("/dashboard").location == "/dashboard/login")
            #expect(try await one.get("/dashboard").location == "/dashboard/login")
            try await Task.sleep(for: .milliseconds(1100))
            let fresh = DashboardTests.Browser(client)
            _ = try await fresh.post("/dashboard/login", ["key": API.secret])
            #expect(try await fresh.get("/dashboard").status == .ok)
            let audit = try await API.call(client, .get, "/v1/audit")
            #expect("\(audit.json)".contains("dashboard_sign_out_everywhere"))
            _ = app
        }
    }

    @Test func signInIsLimitedPerAddressAndInAll() {
        let limiter = SignInLimiter()
        let start = ContinuousClock.now
        for _ in 0..<10 { #expect(limiter.admit(address: "10.0.0.1", now: start) == nil) }
        let wait = limiter.admit(address: "10.0.0.1", now: start)
        #expect(wait != nil && wait! >= 1)
        // Another address has its own allowance, until the whole server's is spent.
        var admitted = 0
        for index in 0..<100 where limiter.admit(address: "10.0.1.\(index)", now: start) == nil { admitted += 1 }
        #expect(admitted == 20, "30 in all, 10 taken by the first address")
        // Time refills both.
        #expect(limiter.admit(address: "10.0.2.1", now: start + .seconds(2)) == nil)
        #expect(limiter.admit(address: "10.0.0.1", now: start + .seconds(7)) == nil)
    }

    @Test func signInAttemptsPastTheLimitAre429WithoutLookingAtTheKey() async throws {
        try await API.withServer("sqlite") { app, client in
            let browser = DashboardTests.Browser(client)
            // A burst of wrong keys from one address: the first ten are looked at (401), the rest
            // are refused before the key is (429). Sent at once, so no token refills meanwhile.
            let statuses = try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        try await DashboardTests.Browser(client).post("/dashboard/login", ["key": "sk_x"]).status
                    }
                }
                var all: [HTTPResponse.Status] = []
                for try await status in group { all.append(status) }
                return all
            }
            #expect(statuses.filter { $0 == .unauthorized }.count == 10, "\(statuses)")
            #expect(statuses.filter { $0 == .tooManyRequests }.count == 6, "\(statuses)")
            // Spent (drained again here, whatever refilled): the right key is refused too.
            while app.dashboardSessions.signIns.admit(address: "unknown") == nil {}
            let right = try await browser.post("/dashboard/login", ["key": API.secret])
            #expect(right.status == .tooManyRequests && right.headers[.retryAfter] != nil)
            #expect(browser.cookie == nil)
        }
    }

    // MARK: 7. Log lines

    final class Lines: TextOutputStream, @unchecked Sendable {
        let text = Mutex("")
        func write(_ string: String) { text.withLock { $0 += string } }
    }

    @Test func theLogHandlerEscapesControlCharactersInMessagesAndMetadata() {
        let lines = Lines()
        var logger = Logger(label: "t") { LazyMetadataLogHandler(label: $0, stream: lines) }
        logger.logLevel = .info
        logger[metadataKey: "handler"] = "a\rb"
        logger.warning(
            "proof rejected\nFAKE 2026-01-01 critical: operator key is sk_live",
            metadata: [
                "reason": "alg 'x\r\nINJECTED'", "list": .array(["\u{85}", "ok"]),
                "nested": .dictionary(["k\n": "\u{2028}"]),
            ])
        let text = lines.text.withLock { $0 }
        #expect(text.filter { $0 == "\n" }.count == 1, "\(text.debugDescription)")
        #expect(!text.contains("\r") && !text.contains("\u{85}") && !text.contains("\u{2028}"))
        #expect(text.contains(#"proof rejected\nFAKE"#) && text.contains(#"x\r\nINJECTED"#))
    }

    @Test func aHostileAlgIsQuotedInTheAnswerAndTheLog() async throws {
        let lines = Lines()
        try await API.withServer("sqlite") { app, _ in
            var logger = Logger(label: "audit") { LazyMetadataLogHandler(label: $0, stream: lines) }
            logger.logLevel = .info
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("audit-log-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            try await SharedLocalPKI.seed(directory)
            let probe = try await StoreKeeperApp.make(app.configuration, dataDirectory: directory, logger: logger)
            try await API.drive(probe) { _, client in
                func b64(_ text: String) -> String {
                    Data(text.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
                        .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                }
                let jws = b64(#"{"alg":"E\r\nFAKE LINE\u001b[31m"}"#) + "." + b64("{}") + ".AAAA"
                let reply = try await API.call(
                    client, .post, "/v1/purchases", body: #"{"accountId":"u1","signedTransaction":"\#(jws)"}"#)
                #expect(reply.status == .unprocessableContent || reply.status == .badRequest, "\(reply.json)")
                let message = reply.errorMessage ?? ""
                #expect(!message.contains("\r") && !message.contains("\n") && !message.contains("\u{1B}"))
                #expect(message.contains(#"\u{d}\u{a}FAKE LINE"#), "\(message)")
                let notification = try await API.call(
                    client, .post, "/v1/notifications/apple", token: nil, body: #"{"signedPayload":"\#(jws)"}"#)
                #expect(notification.status.code >= 400)
            }
        }
        let text = lines.text.withLock { $0 }
        for line in text.split(separator: "\n") {
            #expect(!line.hasPrefix("FAKE"), "\(text)")
        }
        #expect(!text.contains("\u{1B}"))
    }
}
