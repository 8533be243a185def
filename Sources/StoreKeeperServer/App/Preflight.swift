import AppStoreClient
import AsyncHTTPClient
import Foundation
import GooglePlay
import KeyFiles
import StoreKeeperStorage

/// `storekeeper config check --connect`: what a configuration reaches, not only what it says —
/// the database (and the migrations a start would apply), one authenticated call to each App
/// Store and Google Play app, Google's push certificates, and every key file's permissions. Each
/// check has a deadline; a failure names what to fix.
public enum Preflight {
    public struct Check: Sendable, Hashable, Encodable {
        public var name: String
        public var ok: Bool
        public var detail: String
    }

    static let deadline: Duration = .seconds(15)

    public static func run(_ configuration: ServerConfiguration) async -> [Check] {
        var checks: [Check] = []
        checks.append(await database(configuration))
        checks += await appStore(configuration)
        checks += await googlePlay(configuration)
        checks += await stripe(configuration)
        checks += keyFiles(configuration)
        return checks
    }

    // MARK: The database

    static func database(_ configuration: ServerConfiguration) async -> Check {
        let url = configuration.databaseURL
        let name = "database"
        if url.hasPrefix("sqlite:") {
            let path = String(url.dropFirst("sqlite:".count))
            // A check never creates the file `serve` would create.
            guard path == ":memory:" || FileManager.default.fileExists(atPath: path) else {
                let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
                guard FileManager.default.isWritableFile(atPath: directory.isEmpty ? "." : directory) else {
                    return Check(
                        name: name, ok: false, detail: "\(path) does not exist and \(directory) is not writable")
                }
                return Check(
                    name: name, ok: true,
                    detail: "\(path) will be created at the first start; \(Migrations.all.count) migrations will run")
            }
        }
        // PostgreSQL: one connection of its own first, so a wrong password, a missing database or
        // a server that is down is named as such within seconds (a pool retries a refused
        // password until the deadline, and then only says it timed out).
        if let problem = await Database.connectionProblem(url: url) {
            return Check(name: name, ok: false, detail: problem.message)
        }
        do {
            return try await preflightDeadline(deadline, what: "the database") {
                let database = try await Database.open(url: url)
                let applied: Set<Int>
                do {
                    applied = Set(try await Migrations.appliedVersionsIfAny(on: database))
                    try? await database.close()
                } catch {
                    try? await database.close()
                    throw error
                }
                let known = Set(Migrations.all.map(\.version))
                if let newer = applied.subtracting(known).max() {
                    return Check(
                        name: name, ok: false,
                        detail:
                            "the schema is newer than this binary knows (migration \(newer)): run the release that wrote it, or a later one"
                    )
                }
                let pending = known.subtracting(applied).sorted()
                let what =
                    pending.isEmpty
                    ? "the schema is up to date (\(applied.count) migrations)"
                    : "\(pending.count) migrations will run at start (\(pending.first!)…\(pending.last!))"
                return Check(name: name, ok: true, detail: "connected (\(database.kind)); \(what)")
            }
        } catch {
            return Check(name: name, ok: false, detail: "cannot connect: \(Self.describe(error))")
        }
    }

    /// `body` within `deadline`, else a failure naming `what` did not answer (each check its
    /// own words: never another store's).
    static func preflightDeadline<T: Sendable>(
        _ deadline: Duration, what: String, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        try await withThrowingTaskGroup(of: T.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: deadline)
                throw PreflightFailure("\(what) did not answer within \(deadline)")
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
    }

    // MARK: The stores

    static func appStore(_ configuration: ServerConfiguration) async -> [Check] {
        guard configuration.serverAPIPrivateKeyFile != nil || configuration.serverAPIKeyId != nil else {
            return []
        }
        let pem: String?
        do {
            pem = try configuration.serverAPIPrivateKeyPEM()
        } catch {
            return [Check(name: "App Store Server API", ok: false, detail: "\(error)")]
        }
        guard let pem, let issuerId = configuration.serverAPIIssuerId, let keyId = configuration.serverAPIKeyId else {
            return [
                Check(
                    name: "App Store Server API", ok: false,
                    detail: "apple.serverAPI needs issuerId, keyId and privateKeyFile together")
            ]
        }
        var checks: [Check] = []
        let bundles = ([configuration.bundleId].compactMap { $0 }) + configuration.otherAppStoreApps.map(\.bundleId)
        for bundleId in bundles {
            let name = "App Store Server API (\(bundleId))"
            do {
                let detail = try await preflightDeadline(deadline, what: "Apple") {
                    let client = try await AppStoreServerAPIClient(
                        configuration: .init(
                            credentials: ServerAPICredentials(
                                issuerId: issuerId, keyId: keyId, privateKeyPEM: pem, bundleId: bundleId),
                            environment: configuration.environments.contains(.production) ? .production : .sandbox,
                            baseURL: configuration.serverAPIBaseURL, timeout: .seconds(10), retryPolicy: .none))
                    do {
                        // A transaction that does not exist: Apple answers 404 to a key it accepts.
                        _ = try await client.getTransactionInfo("1")
                        return "the key is accepted"
                    } catch let error as AppStoreAPIError where error.kind != .unauthorized && error.httpStatus != nil {
                        return "the key is accepted (a look-up answered \(error.httpStatus!))"
                    }
                }
                checks.append(Check(name: name, ok: true, detail: detail))
            } catch let error as AppStoreAPIError where error.kind == .unauthorized {
                checks.append(
                    Check(
                        name: name, ok: false,
                        detail:
                            "Apple refused the key (401): check apple.serverAPI.keyId, issuerId, privateKeyFile, the bundle id and this machine's clock"
                    ))
            } catch {
                checks.append(Check(name: name, ok: false, detail: "cannot reach Apple: \(Self.describe(error))"))
            }
        }
        return checks
    }

    static func googlePlay(_ configuration: ServerConfiguration) async -> [Check] {
        var checks: [Check] = []
        var certificates = Set<String>()
        for app in configuration.googlePlayApps {
            let name = "Google Play Developer API (\(app.id), \(app.packageName))"
            do {
                try await preflightDeadline(deadline, what: "Google Play") {
                    let google = try await GooglePlayApp.make(app)
                    _ = try await google.client.voidedPurchases(
                        startTime: Date().addingTimeInterval(-3600), pageToken: nil, maxResults: 1)
                }
                checks.append(Check(name: name, ok: true, detail: "an access token was issued and a read answered"))
            } catch {
                checks.append(
                    Check(
                        name: name, ok: false,
                        detail:
                            "\(Self.describe(error)) — check serviceAccountKeyFile and that the service account is invited in Play Console with \"View financial data\""
                    ))
            }
            if app.pushAudience != nil { certificates.insert(app.pushCertificatesURL) }
        }
        for url in certificates.sorted() {
            let name = "Google push certificates (\(url))"
            do {
                let count = try await preflightDeadline(deadline, what: "Google's push certificates") {
                    var request = HTTPClientRequest(url: url)
                    request.method = .GET
                    let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
                    let body = try await response.body.collect(upTo: 1 << 20)
                    guard response.status == .ok,
                        let json = try? JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any],
                        let keys = json["keys"] as? [Any], !keys.isEmpty
                    else { throw PreflightFailure("answered \(response.status.code) without a key set") }
                    return keys.count
                }
                checks.append(Check(name: name, ok: true, detail: "\(count) keys"))
            } catch {
                checks.append(Check(name: name, ok: false, detail: Self.describe(error)))
            }
        }
        return checks
    }

    /// One authenticated read per Stripe app (the events list, one item).
    static func stripe(_ configuration: ServerConfiguration) async -> [Check] {
        var checks: [Check] = []
        for app in configuration.stripeApps {
            let name = "Stripe API (\(app.id))"
            do {
                let mode = try await preflightDeadline(deadline, what: "Stripe") {
                    let stripe = try StripeApp.make(app)
                    try await stripe.client.ping()
                    return stripe.client.isTestMode ? "test mode" : "live mode"
                }
                checks.append(Check(name: name, ok: true, detail: "the key answered (\(mode))"))
            } catch {
                checks.append(
                    Check(
                        name: name, ok: false,
                        detail:
                            "\(Self.describe(error)) — check secretKeyFile (sk_… or rk_… with read access to Events)"
                    ))
            }
        }
        return checks
    }

    // MARK: Key files

    /// Every file holding a secret is its owner's alone.
    static func keyFiles(_ configuration: ServerConfiguration) -> [Check] {
        var files: [(String, String)] = []
        if let file = configuration.serverAPIPrivateKeyFile { files.append(("apple.serverAPI.privateKeyFile", file)) }
        if let file = configuration.offersPrivateKeyFile { files.append(("apple.offers.privateKeyFile", file)) }
        for app in configuration.googlePlayApps {
            if let file = app.serviceAccountKeyFile { files.append(("apps[\(app.id)].serviceAccountKeyFile", file)) }
        }
        for app in configuration.stripeApps {
            if let file = app.secretKeyFile { files.append(("apps[\(app.id)].secretKeyFile", file)) }
        }
        for key in configuration.signingKeySources where !key.contains("-----BEGIN") {
            files.append(("auth.responseSigningKeys", key))
        }
        return files.map { key, path in
            if !FileManager.default.fileExists(atPath: path) {
                return Check(name: "key file \(key)", ok: false, detail: "\(path) does not exist")
            }
            if let exposure = KeyFiles.exposure(of: path) {
                return Check(name: "key file \(key)", ok: false, detail: exposure)
            }
            return Check(name: "key file \(key)", ok: true, detail: "\(path): readable by its owner only")
        }
    }

    struct PreflightFailure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    static func describe(_ error: any Error) -> String {
        let text = String(describing: error)
        return text.count > 300 ? String(text.prefix(300)) + "…" : text
    }
}
