import Foundation
import LocalStripe
import Logging
import StoreKeeperCatalog
import Stripe

extension StoreKeeperApp {
    /// Demo mode or `localStripe.enabled`: the built-in local Stripe, mounted at
    /// `/local-stripe`, stands in for Stripe for the (first) Stripe app — created as `stripe`
    /// when none is configured — with its own secret key and webhook secret, its events sent
    /// to this server's `/v1/notifications/stripe`. Needs a known port (not 0).
    static func localStripe(_ configuration: inout ServerConfiguration, catalog: Catalog, logger: Logger)
        -> LocalStripeServer?
    {
        guard configuration.mode == .demo || configuration.localStripeEnabled else { return nil }
        guard configuration.port != 0 else {
            logger.notice("local Stripe not started: it needs a fixed http.port")
            return nil
        }
        let host =
            ["0.0.0.0", "::"].contains(configuration.host)
            ? "127.0.0.1" : configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
        let base = "http://\(host):\(configuration.port)/local-stripe"
        let server = LocalStripeServer(
            stripe: LocalStripe(configuration: .init(catalog: catalog)), publicBaseURL: base)
        var app = configuration.stripeApps.first ?? StripeAppConfiguration(id: "stripe")
        let secret = "whsec_local_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        app.secretKey = server.secretKey
        app.secretKeyFile = nil
        app.webhookSecrets = [secret]
        app.apiBaseURL = base
        if configuration.stripeApps.isEmpty {
            app.successURL = "http://\(host):\(configuration.port)/local-stripe/done"
            app.cancelURL = "http://\(host):\(configuration.port)/local-stripe/cancelled"
            configuration.stripeApps = [app]
        } else {
            configuration.stripeApps[0] = app
        }
        server.configureWebhook {
            $0.url = "http://\(host):\(configuration.port)/v1/notifications/stripe"
            $0.secrets = [secret]
        }
        logger.notice("local Stripe: Stripe app '\(app.id)' is served by the built-in fake at \(base)")
        if configuration.mode != .demo {
            logger.warning(
                "localStripe.enabled: the built-in local Stripe stands in for Stripe (app '\(app.id)'): payments are fake. Never in production."
            )
        }
        return server
    }
}
