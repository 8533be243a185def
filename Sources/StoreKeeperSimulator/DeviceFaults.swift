import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

struct TraceLogger: StoreKeeperLogger {
    let device: String
    func log(_ level: LogLevel, _ message: String) { trace("\(device) sdk \(level): \(message)") }
}

/// The process died here (a simulated crash): everything the app was doing stops.
struct SimulatedCrash: Error {}

/// What can go wrong on a device, each a probability per opportunity.
public struct DeviceFaults: Sendable, Equatable {
    public var crash: Double = 0
    public var network: Double = 0
    /// Submissions only fail (the order was created; the upload does not get through).
    public var submissionFailure: Double = 0
    /// StoreKit returns the transaction without its token (and the payment carried none).
    public var dropToken: Double = 0
    /// The same callback twice.
    public var duplicate: Double = 0
    /// The callback never comes in this run of the app; the next launch's sweep finds it.
    public var dropCallback: Double = 0
    /// The callback comes late, through `updates`.
    public var delay: Double = 0
    /// Two products paid in one payment (the second reported through `updates`, first or last).
    public var merge: Double = 0
    /// Ask to Buy: a parent approves later, after a restart.
    public var askToBuy: Double = 0
    /// StoreKit hands the oldest unfinished transaction to the new payment instead of paying
    /// (P11: an unfinished consumable resurfacing under a new order).
    public var staleCallback: Double = 0
    /// The user taps buy twice.
    public var doubleTap: Double = 0
    /// A proxy in front of the server answers HTML 400/404/413/502 instead of it (before the
    /// server saw the request, or after it answered).
    public var middlebox: Double = 0
    /// The device clock jumps back or forward by up to a day (per purchase).
    public var clockJump: Double = 0
    /// A purchase made outside the app (an offer code, a promoted purchase) arrives, token-less.
    public var tokenless: Double = 0
    /// StoreKit 1: the callback comes after the purchase call gave up waiting (so callbacks of
    /// successive payments arrive out of order).
    public var lateCallback: Double = 0
    /// StoreKit 1: the app receipt read at upload is an older one, without the newest purchase.
    public var staleReceipt: Double = 0
    /// The user logs out and in as another of the device's accounts (per purchase).
    public var switchAccount: Double = 0

    public init() {}

    public static let none = DeviceFaults()
}

/// A deterministic generator (SplitMix64), one per device (and one per chaos run), so a seed
/// replays the same choices.
public struct SeededRandom: Sendable {
    var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }
    public mutating func chance(_ p: Double) -> Bool { p > 0 && unit() < p }
    public mutating func below(_ n: Int) -> Int { Int(next() % UInt64(max(n, 1))) }
}

/// One simulated phone: an Apple ID, one app account, StoreKit's queue (which outlives the
/// app), and the app itself — a `PurchaseCoordinator` rebuilt from its store file after every
/// crash. Every component the coordinator talks to is wrapped for one run of the app (a
/// generation): when the generation crashes, its writes, payments, finishes and requests stop.
