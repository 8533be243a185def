// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "StoreKeeper",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "AppStoreModels", targets: ["AppStoreModels"]),
        .library(name: "AppStoreVerification", targets: ["AppStoreVerification"]),
        .library(name: "AppStoreSigning", targets: ["AppStoreSigning"]),
        .library(name: "AppStoreClient", targets: ["AppStoreClient"]),
        .library(name: "StoreKeeperCatalog", targets: ["StoreKeeperCatalog"]),
        .library(name: "StoreKeeperCore", targets: ["StoreKeeperCore"]),
        .library(name: "StoreKeeperStorage", targets: ["StoreKeeperStorage"]),
        .library(name: "StoreKeeperServer", targets: ["StoreKeeperServer"]),
        .library(name: "LocalAppStore", targets: ["LocalAppStore"]),
        .executable(name: "storekeeper", targets: ["StoreKeeperCLI"]),
        .executable(name: "storekeeper-fuzz", targets: ["StoreKeeperFuzz"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.34.1"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/vapor/sql-kit.git", from: "3.36.0"),
        .package(url: "https://github.com/vapor/sqlite-kit.git", from: "4.5.2"),
        .package(url: "https://github.com/vapor/postgres-kit.git", from: "2.17.0"),
        .package(url: "https://github.com/apple/swift-configuration.git", from: "1.4.0", traits: ["JSON", "YAML"]),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // Tests only: an independent RFC 4180 reader for the CSV exports.
        .package(url: "https://github.com/yaslab/CSV.swift.git", from: "2.5.2"),
        .package(url: "https://github.com/hummingbird-project/swift-mustache.git", from: "2.1.1"),
        // `storekeeper mcp`: the support desk for agents over the Model Context Protocol.
        .package(url: "https://github.com/modelcontextprotocol/swift-sdk.git", from: "0.12.1"),
        // The client SDK, its own package (it depends on nothing of ours): `storekeeper
        // simulate` and the device-side integration tests run its real core.
        .package(path: "Clients/StoreKeeperKit"),
    ],
    targets: [
        // Codable types for every Apple payload; no dependencies so the client SDK can share them.
        .target(name: "AppStoreModels", dependencies: ["StoreKeeperSupport"]),
        // What every module shares and no store owns: strict Base64 and hex, JSON output, row
        // identifiers, client text made safe to show inside a message.
        .target(name: "StoreKeeperSupport"),
        // A server connection's requests handled on its own event loop's thread (the server and
        // the local Google Play).
        .target(
            name: "EventLoopPinning",
            dependencies: [
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        // ES256 verification with a precomputed table of the signing key, over BoringSSL's
        // P-256 assembly as swift-crypto links it (P256Table.swift says why).
        .target(name: "CP256Verify", dependencies: [.product(name: "Crypto", package: "swift-crypto")]),
        // Pure, offline verification of JWS and PKCS#7 app receipts.
        .target(
            name: "AppStoreVerification",
            dependencies: [
                "AppStoreModels", "StoreKeeperSupport",
                "CP256Verify",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        // Signing in Apple's formats: a PKI shaped like Apple's, JWS, app receipts.
        // Used by the local App Store and by every test suite.
        .target(
            name: "AppStoreSigning",
            dependencies: [
                "AppStoreModels",
                "AppStoreVerification",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        // HTTP clients for the App Store Server API and legacy verifyReceipt.
        .target(
            name: "AppStoreClient",
            dependencies: [
                "AppStoreModels",
                "AppStoreVerification",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Google Play's server side: Developer API client (service-account auth), its payloads,
        // Pub/Sub push verification (google-play.md).
        // Private key files: written 0600 from the first byte, refused when others may read them.
        .target(name: "KeyFiles"),
        .target(
            name: "GooglePlay",
            dependencies: [
                "KeyFiles", "StoreKeeperSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "JWTKit", package: "jwt-kit"),
            ]
        ),
        // The local Google Play: a faithful fake of Google's server side (google-play.md).
        .target(
            name: "LocalGooglePlay",
            dependencies: [
                "GooglePlay", "StoreKeeperCatalog", "LocalAppStore", "KeyFiles", "StoreKeeperSupport",
                "EventLoopPinning",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        // Stripe's API and webhook signatures (the third store's wire types; docs/stripe.md).
        .target(
            name: "Stripe",
            dependencies: [
                "StoreKeeperSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The local Stripe: a stateful fake of Stripe's API, Checkout, test clocks and webhooks.
        .target(
            name: "LocalStripe",
            dependencies: [
                "Stripe", "StoreKeeperCatalog",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The product catalog file shared by the server and the local App Store (docs/api.md).
        .target(
            name: "StoreKeeperCatalog",
            dependencies: [.product(name: "Yams", package: "Yams")]
        ),
        // Domain decisions as pure functions: orders, delivery planning, grants, ownership.
        .target(name: "StoreKeeperCore", dependencies: ["StoreKeeperCatalog", "StoreKeeperSupport"]),
        // The App Store's adapter: Apple's signed transactions, renewal infos and notifications
        // read into the core's store-neutral values (no Apple type goes further).
        .target(name: "AppStoreAdapter", dependencies: ["AppStoreModels", "StoreKeeperCore", "StoreKeeperCatalog"]),
        // One schema and query layer over SQLite (default) and PostgreSQL.
        .target(
            name: "StoreKeeperStorage",
            dependencies: [
                "StoreKeeperCore", "StoreKeeperSupport", "StoreKeeperCatalog",
                .product(name: "SQLKit", package: "sql-kit"),
                .product(name: "SQLiteKit", package: "sqlite-kit"),
                .product(name: "PostgresKit", package: "postgres-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The HTTP API of docs/api.md on Hummingbird.
        .target(
            name: "StoreKeeperServer",
            dependencies: [
                "StoreKeeperStorage", "StoreKeeperCore", "StoreKeeperCatalog", "AppStoreModels", "AppStoreVerification",
                "AppStoreAdapter",
                "AppStoreClient", "LocalAppStore", "GooglePlay", "LocalGooglePlay", "KeyFiles", "Stripe", "LocalStripe",
                "EventLoopPinning",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Mustache", package: "swift-mustache"),
            ],
            // The OpenAPI document (a link to docs/openapi.yaml), compiled in: `GET /openapi.json`.
            resources: [.embedInCode("OpenAPI/openapi.yaml")]
        ),
        // The local App Store: a faithful fake of Apple for tests, the demo and zero-config serve.
        .target(
            name: "LocalAppStore",
            dependencies: [
                "AppStoreModels", "KeyFiles",
                "AppStoreVerification",
                "AppStoreSigning",
                "AppStoreClient",
                "StoreKeeperCatalog",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        // `storekeeper mcp`: the support desk's tools over MCP (stdio and streamable HTTP), each
        // one call of the server's HTTP API with the caller's own key.
        .target(
            name: "StoreKeeperMCP",
            dependencies: [
                .product(name: "MCP", package: "swift-sdk"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // Simulated devices: StoreKeeperKit's core against a scripted payment queue paid at the
        // local App Store, through crashes and faults (`storekeeper simulate`, integration tests).
        .target(
            name: "StoreKeeperSimulator",
            dependencies: [
                .product(name: "StoreKeeperKitCore", package: "StoreKeeperKit"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "StoreKeeperCLI",
            dependencies: [
                "StoreKeeperSimulator", "StoreKeeperMCP", "StoreKeeperSupport",
                "AppStoreModels",
                "AppStoreVerification",
                "AppStoreSigning",
                "AppStoreClient",
                "LocalAppStore",
                "GooglePlay", "Stripe", "LocalStripe",
                "LocalGooglePlay",
                "StoreKeeperCatalog",
                "StoreKeeperServer",
                "StoreKeeperStorage",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "SQLKit", package: "sql-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // What the libFuzzer targets feed hostile bytes to, and the seed corpus (scripts/fuzz).
        .target(
            name: "StoreKeeperFuzzTargets",
            dependencies: [
                "AppStoreModels", "AppStoreVerification", "AppStoreSigning", "StoreKeeperCatalog", "StoreKeeperServer",
                "LocalAppStore", "GooglePlay", "StoreKeeperCore",
            ]
        ),
        // A libFuzzer binary when scripts/fuzz builds it with -sanitize=fuzzer,address; built
        // normally, it replays inputs and writes the seed corpus.
        .executableTarget(name: "StoreKeeperFuzz", dependencies: ["StoreKeeperFuzzTargets"]),
        .testTarget(
            name: "StoreKeeperFuzzTests",
            dependencies: [
                "StoreKeeperFuzzTargets", "AppStoreModels", "AppStoreVerification", "StoreKeeperCatalog",
                "StoreKeeperServer",
            ]
        ),
        .testTarget(name: "AppStoreModelsTests", dependencies: ["AppStoreModels", "StoreKeeperSupport"]),
        .testTarget(
            name: "AppStoreVerificationTests",
            dependencies: [
                "AppStoreModels", "AppStoreVerification", "AppStoreSigning", "CP256Verify",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        .testTarget(
            name: "AppStoreClientTests",
            dependencies: [
                "AppStoreModels", "AppStoreVerification", "AppStoreSigning", "AppStoreClient",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "LocalAppStoreTests",
            dependencies: [
                "LocalAppStore", "AppStoreSigning", "AppStoreVerification", "AppStoreModels", "AppStoreClient",
                "StoreKeeperCatalog",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "GooglePlayTests",
            dependencies: [
                "GooglePlay", "LocalGooglePlay", "LocalAppStore", "StoreKeeperCatalog",
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "StoreKeeperCatalogTests", dependencies: ["StoreKeeperCatalog"]),
        .testTarget(
            name: "StoreKeeperCoreTests",
            dependencies: ["StoreKeeperCore", "StoreKeeperCatalog", "AppStoreModels", "AppStoreAdapter"]),
        .testTarget(
            name: "StoreKeeperStorageTests",
            dependencies: [
                "StoreKeeperStorage", "StoreKeeperCore", "StoreKeeperCatalog", "AppStoreModels", "AppStoreAdapter",
                "StoreKeeperSupport",
            ]
        ),
        .testTarget(
            name: "StoreKeeperServerTests",
            dependencies: [
                "StoreKeeperServer", "StoreKeeperStorage", "StoreKeeperCatalog", "AppStoreModels", "AppStoreAdapter",
                "AppStoreSigning",
                "LocalAppStore", "AppStoreClient", "StoreKeeperSimulator", "GooglePlay", "LocalGooglePlay", "KeyFiles",
                "StoreKeeperMCP", "StoreKeeperSupport", "EventLoopPinning",
                .product(name: "MCP", package: "swift-sdk"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "StoreKeeperKitCore", package: "StoreKeeperKit"),
                .product(name: "SQLKit", package: "sql-kit"),
                .product(name: "CSV", package: "CSV.swift"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
            ]
        ),
        .testTarget(
            name: "StoreKeeperCLITests",
            dependencies: [
                "StoreKeeperStorage", .product(name: "SQLKit", package: "sql-kit"),
                "StoreKeeperCLI", "StoreKeeperSimulator", "AppStoreSigning", "AppStoreVerification", "AppStoreClient",
                "AppStoreModels",
                "LocalAppStore", "StoreKeeperSupport",
            ]
        ),
    ]
)
