import AppStoreModels
import Crypto
import Foundation
import Synchronization

/// The dashboard's sessions: a signed cookie, so every instance behind a load balancer accepts
/// it; only sessions ended early (sign-out, "sign out everywhere") are stored, in the database
/// (`DashboardSessionStore`), where every instance reads them. Each configured secret key derives its own signing key, so a key
/// taken out of `auth.secretKeys` ends every session it opened.
///
/// Token: `v1.<issued>.<lastSeen>.<nonce>.<mac>`, seconds since 1970 and 32 hex digits of
/// randomness, the MAC an HMAC-SHA256 of the rest. A session ends after `idle` seconds
/// without a request, or `maximum` seconds after sign-in, whichever is first. Its CSRF token is
/// an HMAC of its nonce: every form that changes state carries it.
struct DashboardSessions: Sendable {
    struct Session: Sendable, Equatable {
        var issued: Int64
        var lastSeen: Int64
        var nonce: String
        /// Which secret key signed it.
        var keyIndex: Int
    }

    enum Check: Sendable, Equatable {
        case valid(Session)
        /// Signed by us, but idle too long or past its maximum age.
        case expired
        /// Absent, malformed or not signed by any current key.
        case invalid
    }

    static let cookieName = "storekeeper_session"

    let keys: [SymmetricKey]
    /// Each key's public name in storage ("sign out everywhere" is per key): an HMAC of a fixed
    /// label, so the table never holds anything the key could be recovered from.
    let keyIds: [String]
    let idle: Int64
    let maximum: Int64
    /// Sign-in attempts, limited per client address and in all.
    let signIns: SignInLimiter

    /// Who each key is: a secret key of `auth.secretKeys` (admin), or an `auth.keys` entry with
    /// its label, scope and the apps it is limited to (nil: every app) — the dashboard then
    /// shows those apps' rows only.
    struct Role: Sendable, Equatable {
        var label: String
        var scope: KeyScope
        var apps: Set<String>? = nil

        /// Whether a row of `appId` is shown (a row with no app: only to a key of every app).
        func covers(app appId: String?) -> Bool {
            guard let apps else { return true }
            return appId.map(apps.contains) ?? false
        }
    }

    let roles: [Role]
    /// The keys' digests, compared in constant time at sign-in.
    let digests: [SHA256.Digest]

    init(
        secretKeys: [String], operatorKeys: [OperatorKey] = [], idleSeconds: Int, maximumSeconds: Int,
        signIns: SignInLimiter = SignInLimiter()
    ) {
        let secrets = secretKeys.filter { !$0.isEmpty }
        let scoped = operatorKeys.filter { !$0.secret.isEmpty }
        let all = secrets + scoped.map(\.secret)
        roles =
            secrets.indices.map { Role(label: "secret key \($0 + 1)", scope: .admin) }
            + scoped.map { Role(label: $0.label, scope: $0.scope, apps: $0.apps) }
        digests = all.map { SHA256.hash(data: Data($0.utf8)) }
        keys = all.map {
            SymmetricKey(
                data: HMAC<SHA256>.authenticationCode(
                    for: Data("storekeeper dashboard session v1".utf8), using: SymmetricKey(data: Data($0.utf8))))
        }
        keyIds = keys.map {
            HMAC<SHA256>.authenticationCode(for: Data("storekeeper dashboard key id".utf8), using: $0).prefix(16)
                .lowercaseHex
        }
        idle = Int64(max(idleSeconds, 1))
        maximum = Int64(max(maximumSeconds, 1))
        self.signIns = signIns
    }

    /// When a session's cookie stops being accepted whatever happens (seconds since 1970).
    func expiry(_ session: Session) -> Int64 { session.issued + maximum }

    /// The key a presented secret is, in constant time over every key (nil: none).
    func keyIndex(of credential: String) -> Int? {
        let presented = SHA256.hash(data: Data(credential.utf8))
        var matched: Int?
        for (index, digest) in digests.enumerated() {
            var difference: UInt8 = 0
            for (a, b) in zip(digest, presented) { difference |= a ^ b }
            if difference == 0 { matched = matched ?? index }
        }
        return matched
    }

    func role(_ session: Session) -> Role { roles[session.keyIndex] }

    /// A new session for the secret key at `keyIndex`.
    func issue(keyIndex: Int, now: Date) -> String {
        var generator = SystemRandomNumberGenerator()
        let nonce = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }.lowercaseHex
        let seconds = Int64(now.timeIntervalSince1970)
        return token(Session(issued: seconds, lastSeen: seconds, nonce: nonce, keyIndex: keyIndex))
    }

    func token(_ session: Session) -> String {
        let body = "v1.\(session.issued).\(session.lastSeen).\(session.nonce)"
        return body + "."
            + Self.hex(HMAC<SHA256>.authenticationCode(for: Data(body.utf8), using: keys[session.keyIndex]))
    }

    func check(_ token: String?, now: Date) -> Check {
        guard let token, token.utf8.count <= 200 else { return .invalid }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 5, parts[0] == "v1", let issued = Int64(parts[1]), let lastSeen = Int64(parts[2]),
            parts[3].utf8.count == 32, parts[3].allSatisfy(\.isHexDigit), parts[4].utf8.count == 64
        else { return .invalid }
        let body = Data(parts[0..<4].joined(separator: ".").utf8)
        let presented = String(parts[4])
        var matched: Int?
        for (index, key) in keys.enumerated() {
            let expected = Self.hex(HMAC<SHA256>.authenticationCode(for: body, using: key))
            if Self.constantTimeEqual(expected, presented) { matched = matched ?? index }
        }
        guard let keyIndex = matched else { return .invalid }
        let seconds = Int64(now.timeIntervalSince1970)
        // A lastSeen ahead of our clock by more than a minute, or before the sign-in, was never issued by us.
        guard lastSeen >= issued, lastSeen <= seconds + 60 else { return .invalid }
        guard seconds - lastSeen <= idle, seconds - issued <= maximum else { return .expired }
        return .valid(Session(issued: issued, lastSeen: lastSeen, nonce: String(parts[3]), keyIndex: keyIndex))
    }

    /// The session seen again: a new cookie once a quarter of the idle time has passed, so
    /// an operator who keeps working stays signed in and an idle one does not.
    func renewed(_ session: Session, now: Date) -> String? {
        let seconds = Int64(now.timeIntervalSince1970)
        guard seconds - session.lastSeen >= max(idle / 4, 1) else { return nil }
        var next = session
        next.lastSeen = seconds
        return token(next)
    }

    func csrfToken(_ session: Session) -> String {
        Self.hex(
            HMAC<SHA256>.authenticationCode(for: Data("csrf.\(session.nonce)".utf8), using: keys[session.keyIndex]))
    }

    func csrfValid(_ presented: String?, session: Session) -> Bool {
        guard let presented, presented.utf8.count == 64 else { return false }
        return Self.constantTimeEqual(csrfToken(session), presented)
    }

    static func hex(_ mac: HMAC<SHA256>.MAC) -> String {
        mac.lowercaseHex
    }

    static func constantTimeEqual(_ lhs: String, _ rhs: String) -> Bool {
        let a = Array(lhs.utf8)
        let b = Array(rhs.utf8)
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for (x, y) in zip(a, b) { difference |= x ^ y }
        return difference == 0
    }
}

/// Token buckets for `/dashboard/login`: per client address (10 attempts, then one per 6 s) and
/// for the whole server (30, then one per second), so neither one address nor many addresses at
/// once can try keys quickly. Every attempt counts, right or wrong: when a bucket is empty the
/// answer is 429 without looking at the key, so the limit says nothing about it.
final class SignInLimiter: Sendable {
    struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }
    struct Limits: Sendable {
        var perAddressBurst = 10.0
        var perAddressPerSecond = 1.0 / 6
        var globalBurst = 30.0
        var globalPerSecond = 1.0
    }
    private struct State {
        var byAddress: [String: Bucket] = [:]
        var global: Bucket?
    }

    let limits: Limits
    private let state = Mutex(State())

    init(limits: Limits = Limits()) { self.limits = limits }

    /// nil when admitted; otherwise whole seconds to wait.
    func admit(address: String, now: ContinuousClock.Instant = .now) -> Int? {
        state.withLock { state in
            if state.byAddress.count >= 10_000 {
                // Buckets that have refilled change nothing when forgotten.
                let full = limits.perAddressBurst / limits.perAddressPerSecond
                state.byAddress = state.byAddress.filter { Self.seconds(now - $0.value.updated) < full }
            }
            var global = Self.refilled(
                state.global, burst: limits.globalBurst, rate: limits.globalPerSecond, now: now)
            var own = Self.refilled(
                state.byAddress[address], burst: limits.perAddressBurst, rate: limits.perAddressPerSecond, now: now)
            defer {
                state.global = global
                state.byAddress[address] = own
            }
            if own.tokens < 1 { return Int(((1 - own.tokens) / limits.perAddressPerSecond).rounded(.up)) }
            if global.tokens < 1 { return Int(((1 - global.tokens) / limits.globalPerSecond).rounded(.up)) }
            own.tokens -= 1
            global.tokens -= 1
            return nil
        }
    }

    static func refilled(_ bucket: Bucket?, burst: Double, rate: Double, now: ContinuousClock.Instant) -> Bucket {
        guard var bucket else { return Bucket(tokens: burst, updated: now) }
        bucket.tokens = min(burst, bucket.tokens + seconds(now - bucket.updated) * rate)
        bucket.updated = now
        return bucket
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
