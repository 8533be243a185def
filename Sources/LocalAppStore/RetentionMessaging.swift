import AppStoreModels
import AppStoreSigning
import AsyncHTTPClient
import Foundation
import NIOCore
import StoreKeeperCatalog

/// Apple's Retention Messaging at the local App Store (docs/offers-and-retention.md §5): the realtime
/// URL, messages and default messages (auto-approved, as in sandbox), the cancel flow that
/// asks the developer's endpoint with a signed request under Apple's 700 ms budget and falls
/// back to the default message, and the performance test.
extension LocalAppStore {
    /// Apple's budget for an answer.
    public static let retentionBudget: Duration = .milliseconds(700)

    public struct StoredMessage: Sendable, Hashable {
        public var header: String
        public var body: String
    }

    /// What the customer sees after tapping Cancel.
    public struct CancelFlowResult: Codable, Sendable, Hashable {
        /// `message`, `alternateProduct`, `promotionalOffer`, `defaultMessage` or `none`.
        public var shown: String
        public var messageIdentifier: String?
        public var header: String?
        public var body: String?
        /// The switch-plan product, or the offer's product.
        public var productId: String?
        public var offerIdentifier: String?
        /// Why the default message was shown: `SendAttemptResult` (`TIMED_OUT`, `INVALID_RESPONSE`, …),
        /// `EMPTY_RESPONSE` (`{}`) or `NO_REALTIME_URL`.
        public var fallbackReason: String?
        public var elapsedMilliseconds: Int64
        public var requestIdentifier: String
    }

    // MARK: Configuration (Server API)

    public func setRealtimeURL(_ url: String?) { realtimeURL = url }
    public func getRealtimeURL() -> String? { realtimeURL }

    /// Upload Message: refused when the id exists (not idempotent) or fields are too long.
    public func uploadMessage(_ id: String, header: String, body: String) throws {
        guard retentionMessages[id] == nil else { throw RetentionRefusal(status: 409, code: 4_090_001) }
        guard !header.isEmpty, header.count <= 66 else { throw RetentionRefusal(status: 400, code: 4_000_162) }
        guard !body.isEmpty, body.count <= 144 else { throw RetentionRefusal(status: 400, code: 4_000_163) }
        retentionMessages[id] = StoredMessage(header: header, body: body)
    }

    public func deleteMessage(_ id: String) throws {
        guard retentionMessages.removeValue(forKey: id) != nil else {
            throw RetentionRefusal(status: 404, code: 4_040_015)
        }
    }

    public func messageList() -> [MessageListItem] {
        retentionMessages.keys.sorted().map { MessageListItem(messageIdentifier: $0, messageState: "APPROVED") }
    }

    public func setDefaultMessage(productId: String, locale: String, messageId: String?) throws {
        guard let messageId else {
            defaultMessages["\(productId)|\(locale)"] = nil
            return
        }
        guard configuration.catalog.product(productId)?.type == .autoRenewable else {
            throw RetentionRefusal(status: 400, code: 4_000_023)
        }
        guard retentionMessages[messageId] != nil else { throw RetentionRefusal(status: 404, code: 4_040_015) }
        defaultMessages["\(productId)|\(locale)"] = messageId
    }

    public func defaultMessage(productId: String, locale: String) -> String? {
        defaultMessages["\(productId)|\(locale)"]
    }

    public struct RetentionRefusal: Error, Sendable, Hashable {
        public var status: Int
        public var code: Int64
    }

    // MARK: The cancel flow

    /// The signed `Get Retention Message` request for a subscription, as Apple sends it.
    func realtimeRequest(_ originalTransactionId: String, locale: String) throws -> (String, String) {
        guard let subscription = subscriptions[originalTransactionId] else {
            throw StoreError.unknownSubscription(originalTransactionId)
        }
        let identifier = UUID().uuidString.lowercased()
        let payload = DecodedRealtimeRequestBody(
            originalTransactionId: originalTransactionId, appAppleId: configuration.appAppleId,
            productId: subscription.productId, userLocale: locale, requestIdentifier: identifier,
            signedDate: clock.now().milliseconds, environment: configuration.environment)
        return (try signer.sign(payload), identifier)
    }

    /// What the answer makes the customer see, or why the default is shown instead.
    func interpret(
        _ answer: RealtimeResponseBody, originalTransactionId: String
    ) -> (shown: String, message: String?, productId: String?, offer: String?)? {
        guard answer.answers == 1, let subscription = subscriptions[originalTransactionId] else { return nil }
        func approved(_ id: String?) -> String? {
            guard let id, retentionMessages[id.lowercased()] != nil || retentionMessages[id] != nil else { return nil }
            return id
        }
        if let message = answer.message {
            guard let id = approved(message.messageIdentifier) else { return nil }
            return ("message", id, nil, nil)
        }
        if let alternate = answer.alternateProduct {
            guard let id = approved(alternate.messageIdentifier), let productId = alternate.productId,
                configuration.catalog.product(productId)?.group == subscription.group,
                productId != subscription.productId
            else { return nil }
            return ("alternateProduct", id, productId, nil)
        }
        if let offer = answer.promotionalOffer, let id = approved(offer.messageIdentifier) {
            if let jws = offer.promotionalOfferSignatureV2 {
                guard let claims = offerChecker.verifyV2(jws), claims.aud == "promotional-offer",
                    claims.bid == configuration.bundleId, claims.transactionId == originalTransactionId,
                    let productId = claims.productId, let offerId = claims.offerIdentifier,
                    configuration.catalog.product(productId)?.offers?.contains(where: { $0.id == offerId }) == true
                else { return nil }
                return ("promotionalOffer", id, productId, offerId)
            }
            if let v1 = offer.promotionalOfferSignatureV1, let productId = v1.productId,
                let offerId = v1.offerIdentifier,
                let keyId = v1.keyId, let nonce = v1.nonce.flatMap(UUID.init(uuidString:)),
                let timestamp = v1.timestamp,
                let signature = v1.encodedSignature
            {
                let payload = OfferSigner.v1Payload(
                    bundleId: configuration.bundleId, keyId: keyId, productId: productId, offerId: offerId,
                    appAccountToken: v1.appAccountToken, nonce: nonce, timestamp: timestamp)
                guard offerChecker.verifyV1(payload, keyId: keyId, signatureBase64: signature) else { return nil }
                return ("promotionalOffer", id, productId, offerId)
            }
        }
        return nil
    }

    func retentionMessage(_ id: String?) -> StoredMessage? {
        guard let id else { return nil }
        return retentionMessages[id] ?? retentionMessages[id.lowercased()]
    }
}

/// Calls the developer's realtime URL as Apple does: POST `{"signedPayload"}`, 700 ms.
public struct RetentionCaller: Sendable {
    public let store: LocalAppStore
    let httpClient: HTTPClient

    public init(store: LocalAppStore, httpClient: HTTPClient = .shared) {
        self.store = store
        self.httpClient = httpClient
    }

    /// One attempt: the parsed answer, or the `SendAttemptResult` that made it a failure.
    func ask(_ url: String, signedPayload: String, budget: Int64 = 700) async -> (RealtimeResponseBody?, String?, Int64)
    {
        let started = ContinuousClock.now
        func elapsed() -> Int64 {
            let duration = ContinuousClock.now - started
            return duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        }
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "Retention Messaging (StoreKeeper local)")
        let body = (try? JSONEncoder().encode(RealtimeRequestBody(signedPayload: signedPayload))) ?? Data()
        request.body = .bytes(ByteBuffer(bytes: body))
        do {
            let response = try await httpClient.execute(request, timeout: .milliseconds(budget))
            let bytes = try await response.body.collect(upTo: 64 * 1024)
            guard response.status.code == 200 else { return (nil, "UNSUCCESSFUL_HTTP_RESPONSE_CODE", elapsed()) }
            guard elapsed() <= budget else { return (nil, "TIMED_OUT", elapsed()) }
            guard let answer = try? JSONDecoder().decode(RealtimeResponseBody.self, from: Data(buffer: bytes)) else {
                return (nil, "INVALID_RESPONSE", elapsed())
            }
            return (answer, nil, elapsed())
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout {
            return (nil, "TIMED_OUT", elapsed())
        } catch is NIOTooManyBytesError {
            return (nil, "INVALID_RESPONSE", elapsed())
        } catch {
            return (nil, "NO_RESPONSE", elapsed())
        }
    }

    /// The customer taps Cancel on `originalTransactionId`: what they see.
    public func cancelFlow(_ originalTransactionId: String, locale: String = "en-US") async throws
        -> LocalAppStore.CancelFlowResult
    {
        let (signed, identifier) = try await store.realtimeRequest(originalTransactionId, locale: locale)
        let productId = await store.subscriptions[originalTransactionId]?.productId ?? ""
        var result = LocalAppStore.CancelFlowResult(
            shown: "none", elapsedMilliseconds: 0, requestIdentifier: identifier)
        var fallback: String? = "NO_REALTIME_URL"
        if let url = await store.getRealtimeURL() {
            let (answer, failure, elapsed) = await ask(url, signedPayload: signed)
            result.elapsedMilliseconds = elapsed
            fallback = failure
            if let answer {
                if answer.answers == 0 {
                    fallback = "EMPTY_RESPONSE"
                } else if let shown = await store.interpret(answer, originalTransactionId: originalTransactionId) {
                    let message = await store.retentionMessage(shown.message)
                    result.shown = shown.shown
                    result.messageIdentifier = shown.message
                    result.header = message?.header
                    result.body = message?.body
                    result.productId = shown.productId
                    result.offerIdentifier = shown.offer
                    return result
                } else {
                    fallback = "INVALID_RESPONSE"
                }
            }
        }
        result.fallbackReason = fallback
        if let id = await store.defaultMessage(productId: productId, locale: locale) {
            let message = await store.retentionMessage(id)
            result.shown = "defaultMessage"
            result.messageIdentifier = id
            result.header = message?.header
            result.body = message?.body
        }
        return result
    }

    /// Initiate Performance Test: `totalRequests` signed requests, `maxConcurrentRequests` at a
    /// time, each a success when a valid answer comes within `responseTimeThreshold`; PASS when
    /// the success rate reaches `successRateThreshold`. Runs in the background; the result is
    /// read with `performanceTestResult`.
    public func startPerformanceTest(
        _ originalTransactionId: String,
        config: PerformanceTestConfig = .init(
            maxConcurrentRequests: 10, totalRequests: 100, totalDuration: 60_000, responseTimeThreshold: 700,
            successRateThreshold: 95)
    ) async throws -> PerformanceTestResponse {
        guard let url = await store.getRealtimeURL() else {
            throw LocalAppStore.RetentionRefusal(status: 400, code: 4_000_211)
        }
        guard let subscription = await store.subscriptions[originalTransactionId] else {
            throw LocalAppStore.RetentionRefusal(status: 400, code: 4_000_006)
        }
        guard subscription.status == .active || subscription.status == .billingGracePeriod else {
            throw LocalAppStore.RetentionRefusal(status: 400, code: 4_000_211)
        }
        guard await store.runningPerformanceTest == nil else {
            throw LocalAppStore.RetentionRefusal(status: 400, code: 4_000_213)
        }
        let requestId = UUID().uuidString.lowercased()
        let total = Int(config.totalRequests ?? 100)
        await store.recordPerformanceTest(
            requestId,
            PerformanceTestResultResponse(
                config: config, target: url, result: "PENDING", numPending: Int32(total)), running: true)
        let caller = self
        Task {
            await caller.runPerformanceTest(requestId, originalTransactionId, url: url, config: config)
        }
        return PerformanceTestResponse(config: config, requestId: requestId)
    }

    func runPerformanceTest(
        _ requestId: String, _ originalTransactionId: String, url: String, config: PerformanceTestConfig
    ) async {
        let total = Int(config.totalRequests ?? 100)
        let concurrency = max(1, Int(config.maxConcurrentRequests ?? 10))
        let threshold = config.responseTimeThreshold ?? 700
        var times: [Int64] = []
        var failures: [String: Int32] = [:]
        var successes = 0
        await withTaskGroup(of: (Int64, String?).self) { group in
            var started = 0
            func launch() async {
                guard started < total else { return }
                started += 1
                guard let (signed, _) = try? await store.realtimeRequest(originalTransactionId, locale: "en-US") else {
                    return
                }
                group.addTask {
                    let (answer, failure, elapsed) = await ask(url, signedPayload: signed, budget: threshold)
                    if let failure { return (elapsed, failure) }
                    guard let answer, answer.answers <= 1 else { return (elapsed, "INVALID_RESPONSE") }
                    if answer.answers == 1,
                        await store.interpret(answer, originalTransactionId: originalTransactionId) == nil
                    {
                        return (elapsed, "INVALID_RESPONSE")
                    }
                    return (elapsed, elapsed > threshold ? "TIMED_OUT" : nil)
                }
            }
            for _ in 0..<concurrency { await launch() }
            while let (elapsed, failure) = await group.next() {
                times.append(elapsed)
                if let failure { failures[failure, default: 0] += 1 } else { successes += 1 }
                await launch()
            }
        }
        times.sort()
        func percentile(_ p: Double) -> Int64? {
            times.isEmpty ? nil : times[min(times.count - 1, Int((Double(times.count) * p).rounded(.up)) - 1)]
        }
        let rate = total == 0 ? 0 : Int32(successes * 100 / total)
        await store.recordPerformanceTest(
            requestId,
            PerformanceTestResultResponse(
                config: config, target: url, result: rate >= (config.successRateThreshold ?? 95) ? "PASS" : "FAIL",
                successRate: rate, numPending: 0,
                responseTimes: .init(
                    average: times.isEmpty ? nil : times.reduce(0, +) / Int64(times.count), p50: percentile(0.5),
                    p90: percentile(0.9), p95: percentile(0.95), p99: percentile(0.99)),
                failures: failures),
            running: false)
    }
}

extension LocalAppStore {
    func recordPerformanceTest(_ requestId: String, _ result: PerformanceTestResultResponse, running: Bool) {
        performanceTests[requestId] = result
        runningPerformanceTest = running ? requestId : nil
    }

    public func performanceTestResult(_ requestId: String) -> PerformanceTestResultResponse? {
        performanceTests[requestId]
    }
}
