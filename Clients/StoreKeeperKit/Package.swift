// swift-tools-version:5.9
import PackageDescription

// StoreKeeperKit: the client SDK. Foundation only on Apple platforms (CryptoKit for signed
// answers), so an iOS app adding it resolves nothing of the server's. The core (purchase
// coordinator, durable pending store, backend client) is platform-neutral and tested on Linux;
// the StoreKit adapters, the Keychain store and the lifecycle triggers compile where StoreKit,
// Security, UIKit and Network exist — and, on Linux, against shims that declare those APIs
// with Apple's signatures, so CI type-checks them and runs their logic.
var dependencies: [Package.Dependency] = []
var coreDependencies: [Target.Dependency] = []
var kitDependencies: [Target.Dependency] = ["StoreKeeperKitCore"]
var kitSettings: [SwiftSetting] = []
var targets: [Target] = []

#if os(Linux)
    // Signed answers are verified with CryptoKit on Apple platforms; on Linux (the core's tests,
    // the simulator) with swift-crypto, the same API.
    dependencies.append(.package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"))
    coreDependencies.append(.product(name: "Crypto", package: "swift-crypto"))
    // Linux only, tests only: StoreKit's, Security's, UIKit's, Network's and Combine's API surfaces under
    // their own module names. Elsewhere the real frameworks are there and nothing shadows them.
    kitDependencies += ["StoreKit", "Security", "UIKit", "Network", "Combine"]
    kitSettings = [.define("STOREKIT_SHIM"), .define("SECURITY_SHIM")]
    targets += [
        .target(name: "StoreKit", path: "Tests/StoreKitShim"),
        .target(name: "Security", path: "Tests/SecurityShim"),
        .target(name: "UIKit", path: "Tests/UIKitShim"),
        .target(name: "Network", path: "Tests/NetworkShim"),
        .target(name: "Combine", path: "Tests/CombineShim"),
        .target(name: "SwiftUI", dependencies: ["Combine"], path: "Tests/SwiftUIShim"),
        // The adapters, the Keychain store and the triggers, built against the shims.
        .testTarget(
            name: "StoreKitAdapterTypeCheck",
            dependencies: [
                "StoreKeeperKit", "StoreKeeperKitCore", "StoreKit", "Security", "Network", "UIKit", "Combine",
            ]),
        // docs/ios-integration.md's code, extracted (scripts/guide-snippets), built and checked
        // to be the guide's own.
        .testTarget(name: "GuideSnippets", dependencies: ["StoreKeeperKit", "SwiftUI"]),
    ]
#endif

targets += [
    .target(name: "StoreKeeperKitCore", dependencies: coreDependencies),
    .target(
        name: "StoreKeeperKit", dependencies: kitDependencies, resources: [.copy("PrivacyInfo.xcprivacy")],
        swiftSettings: kitSettings),
    .testTarget(name: "StoreKeeperKitCoreTests", dependencies: ["StoreKeeperKitCore"] + coreDependencies),
]

let package = Package(
    name: "StoreKeeperKit",
    // Exactly where every part compiles: StoreKit 2 (iOS 15, macOS 12, tvOS 15), UIKit's or
    // AppKit's lifecycle, the data-protection Keychain. watchOS is not claimed.
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15)],
    products: [
        .library(name: "StoreKeeperKit", targets: ["StoreKeeperKit"]),
        .library(name: "StoreKeeperKitCore", targets: ["StoreKeeperKitCore"]),
    ],
    dependencies: dependencies,
    targets: targets
)
