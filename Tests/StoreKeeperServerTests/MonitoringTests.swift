import Foundation
import HummingbirdTesting
import Testing

/// The Prometheus alert rules and the Grafana dashboard shipped in `deploy/` name only metrics
/// this server exports: renaming one fails here, not silently in an operator's monitoring.
@Suite struct MonitoringTests {
    typealias API = ServerAPITests

    static func metricNames(in file: String) throws -> Set<String> {
        let text = try String(contentsOf: OpenAPITests.root.appendingPathComponent(file), encoding: .utf8)
        var names = Set<String>()
        for match in text.matches(of: try Regex(#"storekeeper_[a-z0-9_]+"#)) {
            var name = String(text[match.range])
            for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                name.removeLast(suffix.count)
            }
            names.insert(name)
        }
        return names
    }

    @Test func everyMetricTheAlertsAndDashboardNameIsExported() async throws {
        let alerts = try Self.metricNames(in: "deploy/prometheus/storekeeper-alerts.yml")
        let dashboard = try Self.metricNames(in: "deploy/grafana/storekeeper-dashboard.json")
        #expect(alerts.count >= 8 && dashboard.count >= 10)
        let dashboardJSON = try JSONSerialization.jsonObject(
            with: Data(
                contentsOf: OpenAPITests.root.appendingPathComponent("deploy/grafana/storekeeper-dashboard.json")))
        #expect(((dashboardJSON as? [String: Any])?["panels"] as? [Any])?.count ?? 0 >= 10)
        try await API.withServer("sqlite") { app, client in
            let bought = try await app.localAppStore!.buy("m", items: [.init(productId: "coins_60")])
            _ = try await API.submit(client, account: "m1", signedTransaction: bought.signedTransactions[0])
            _ = try await API.call(
                client, .post, "/v1/purchases", body: #"{"accountId":"m1","signedTransaction":"x.y.z"}"#)
            let text = try await client.execute(
                uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(API.secret)"]
            ) { String(buffer: $0.body) }
            let exported = Set(
                text.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap {
                    $0.split(whereSeparator: { $0 == "{" || $0 == " " }).first.map(String.init)
                }.map { name in
                    ["_bucket", "_sum", "_count"].reduce(name) { $0.hasSuffix($1) ? String($0.dropLast($1.count)) : $0 }
                })
            for name in alerts.union(dashboard) {
                #expect(exported.contains(name), "\(name) is named in deploy/ but /metrics does not export it")
            }
        }
    }
}
