// swift-tools-version:5.9
import PackageDescription

// StoreKeeperKit: the client SDK. Foundation only, so an iOS app adding it resolves nothing
// of the server's. The core (purchase coordinator, durable pending store, backend client) is
// platform-neutral and tested on Linux; the StoreKit adapters compile only where StoreKit
// exists.
var dependencies: [Package.Dependency] = []
var coreDependencies: [Target.Dependency] = []
#if os(Linux)
    // Signed answers are verified with CryptoKit on Apple platforms; on Linux (the core's tests,
    // the simulator) with swift-crypto, the same API.
    dependencies.append(.package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"))
    coreDependencies.append(.product(name: "Crypto", package: "swift-crypto"))
#endif

var targets: [Target] = [
    .target(name: "StoreKeeperKitCore", dependencies: coreDependencies),
    .target(name: "StoreKeeperKit", dependencies: ["StoreKeeperKitCore"]),
    .testTarget(name: "StoreKeeperKitCoreTests", dependencies: ["StoreKeeperKitCore"] + coreDependencies),
]

#if os(Linux)
    // Linux only, tests only: StoreKit's API surface as Apple declares it, under the module name
    // `StoreKit`, and a test target compiling the adapters (symlinked) against it, so a renamed
    // call or a wrong type fails CI here. Elsewhere the real StoreKit is there and no module
    // may shadow it.
    targets += [
        .target(name: "StoreKit", path: "Tests/StoreKitShim"),
        .testTarget(
            name: "StoreKitAdapterTypeCheck", dependencies: ["StoreKeeperKitCore", "StoreKit"],
            swiftSettings: [.define("STOREKIT_SHIM")]),
    ]
#endif

let package = Package(
    name: "StoreKeeperKit",
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8)],
    products: [
        .library(name: "StoreKeeperKit", targets: ["StoreKeeperKit"]),
        .library(name: "StoreKeeperKitCore", targets: ["StoreKeeperKitCore"]),
    ],
    dependencies: dependencies,
    targets: targets
)
