import Foundation
import StoreKeeperKitCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// StoreKit's side of a simulated device: what it charges, the callbacks it makes (soon, late,
/// twice, without the token), what it keeps unfinished and the receipts it hands out.
extension SimulatedDevice {
    // MARK: StoreKit's side

    func map(_ payment: LocalStoreControl.Payment, owner: String, receiptOnly: Bool = false) -> [StoreTransaction] {
        let merged = receiptOnly || payment.transactions.count > 1
        var result: [StoreTransaction] = []
        for (index, transaction) in payment.transactions.enumerated() {
            // StoreKit 1 has no JWS: its proof is the app receipt.
            let signed = merged || storeKit == .one ? nil : payment.signedTransactions[index]
            if signed == nil { receiptProofs.insert(transaction.transactionId) }
            let mapped = StoreTransaction(
                id: transaction.transactionId, originalId: transaction.originalTransactionId,
                productId: transaction.productId, quantity: transaction.quantity ?? 1,
                appAccountToken: transaction.appAccountToken.flatMap(UUID.init(uuidString:)),
                purchaseDate: Date(timeIntervalSince1970: Double(transaction.purchaseDate ?? 0) / 1000),
                signedTransaction: signed)
            paidBy[mapped.id] = owner
            if let token = mapped.appAccountToken { tokenOfTransaction[mapped.id] = token }
            unfinished.append(mapped)
            result.append(mapped)
        }
        return result
    }

    /// StoreKit 1 hands the callback back without `applicationUsername` at this rate (`drop`,
    /// drawn with the payment).
    func dropTokenInCallback(_ transaction: StoreTransaction, _ drop: Bool) -> StoreTransaction {
        guard storeKit == .one, drop else { return transaction }
        var dropped = transaction
        dropped.appAccountToken = nil
        return dropped
    }

    /// StoreKit tells the app (when the app is running).
    func report(_ transaction: StoreTransaction) {
        continuation?.yield(.transaction(transaction))
    }

    func purchase(productId: String, quantity: Int, token: UUID, gate: Generation) async throws -> PaymentResult {
        trace("\(appleId) pay")
        defer {
            trace("\(appleId) pay done")
            sheetsClosed.insert(token)
        }
        // Whose purchase call this payment is: the account of the order whose token it carries
        // (the sheet may come up after the purchase call gave up waiting for it, and a switch of
        // accounts since does not make it the new account's).
        let owner = account(ofToken: token)
        // The one death that may come before StoreKit charges: drawn with the tap.
        try gate.dieIfPlannedBeforePaying()
        if let tap = secondTap, let coordinator {
            // The player taps "buy" again while this sheet is up: refused as already in progress.
            secondTap = nil
            let paymentsBefore = payments
            if (try? await coordinator.purchase(productId: tap.productId, quantity: tap.quantity)) != nil,
                payments > paymentsBefore
            {
                doubleCharges += 1
            }
        }
        defer {
            beforePayment = false
            gate.closePaymentWindow()
        }
        let items = [(productId: productId, quantity: quantity)]
        // Every choice of this payment, drawn now and always the same number of draws: a crash
        // right after paying (its timing is the run's) must not shift the next purchase's.
        let merges = random.chance(faults.merge)
        let mergePick = random.below(1 << 30)
        let stale = random.chance(faults.staleCallback)
        let asksToBuy = random.chance(faults.askToBuy)
        let dropsCallback = random.chance(faults.dropCallback)
        let reorder = random.chance(0.5)
        let duplicates = random.chance(faults.duplicate)
        let late = random.chance(faults.lateCallback)
        let delays = random.chance(faults.delay)
        let drops = (0..<3).map { _ in random.chance(faults.dropToken) }
        // A merged payment (seed 001: 6 + 30 charged as 36, one callback, both in the receipt):
        // another payment the customer made rides along, without this order's token.
        let mergedWith = merges ? otherConsumable(than: productId, pick: mergePick) : nil
        if stale {
            // No charge: StoreKit answers with an old transaction (P11: an unfinished one; StoreKit
            // 1: one finished before, "restored for free").
            if let stale = unfinished.first {
                if storeKit == .two { return .purchased(stale) }
                reportLater(stale, gate: gate, late: false)
                return .enqueued
            }
            if storeKit == .one, let old = finishedHistory.last(where: { $0.productId == productId }) {
                var restored = old
                restored.appAccountToken = nil
                reportLater(restored, gate: gate, late: false)
                return .enqueued
            }
            // Nothing old to answer with (what is still unfinished depends on the run's timing):
            // the sheet is dismissed. Either way no charge, so what is paid is the seed's alone.
            return .cancelled
        }
        // StoreKit 2 signs the token into the transaction: it never comes back without it (its
        // token-less transactions are purchases made outside the app, `tokenless`). StoreKit 1
        // keeps it in the payment and may drop it in the callback (`applicationUsername` nil).
        let dropToken = false
        if asksToBuy {
            let payment = try await control.pay(
                appleId: appleId, items: items, appAccountToken: dropToken ? nil : token, askToBuy: true)
            if let id = payment.pendingId {
                askToBuy.append(id)
                askToBuyOwner[id] = owner
            }
            if storeKit == .one {
                continuation?.yield(.deferred(productId: productId))
                return .enqueued
            }
            return .deferred
        }
        let payment = try await control.pay(
            appleId: appleId, items: items, appAccountToken: dropToken ? nil : token, askToBuy: false)
        payments += 1
        trace("\(appleId) PAID \(productId)x\(quantity) merged \(mergedWith ?? "-")")
        var transactions = map(payment, owner: owner, receiptOnly: mergedWith != nil)
        if let other = mergedWith {
            let extra = try await control.pay(
                appleId: appleId, items: [(other, 1)], appAccountToken: nil, askToBuy: false)
            transactions += map(extra, owner: currentAccount, receiptOnly: true)
        }
        // The app may die right after paying, before hearing of it.
        try maybeCrash(gate)
        if dropsCallback { return .enqueued }
        if mergedWith != nil, transactions.count == 2 {
            let second = transactions.removeLast()
            if reorder { report(dropTokenInCallback(second, drops[0])) }
            defer { if !reorder { report(dropTokenInCallback(second, drops[0])) } }
        }
        let first = transactions[0]
        if duplicates { report(dropTokenInCallback(first, drops[1])) }
        if storeKit == .one {
            reportLater(dropTokenInCallback(first, drops[2]), gate: gate, late: late)
            return .enqueued
        }
        if delays {
            reportLater(first, gate: gate, late: false)
            return .enqueued
        }
        return .purchased(first)
    }

    /// The observer's callback, soon — or late: after the purchase call gave up waiting, so
    /// that the next payment's callback may come first.
    func reportLater(_ transaction: StoreTransaction, gate: Generation, late: Bool) {
        let delay =
            late
            ? UInt64((purchaseTimeout + noise.unit() * 1.5) * 1_000_000_000)
            : UInt64(noise.below(200)) * 1_000_000
        callbacksOnTheWay += 1
        Task {
            try? await Task.sleep(nanoseconds: delay)
            await self.reportIfRunning(transaction, gate: gate)
            await self.callbackArrived()
        }
    }

    func callbackArrived() { callbacksOnTheWay -= 1 }

    func reportIfRunning(_ transaction: StoreTransaction, gate: Generation) {
        guard !gate.dead, gate === generation else { return }
        report(transaction)
    }

    public func setConsumables(_ ids: [String]) { consumables = ids }
    func otherConsumable(than productId: String, pick: Int) -> String? {
        let others = consumables.filter { $0 != productId }
        return others.isEmpty ? nil : others[pick % others.count]
    }

    func finish(_ transactionId: String, gate: Generation) async {
        guard !gate.dead else { return }
        // Finishing what StoreKit no longer holds (a replayed, finished one) does nothing, and
        // is no point at which the app dies.
        guard unfinished.contains(where: { $0.id == transactionId }), (try? gate.maybeCrash()) != nil else { return }
        if !acknowledged.contains(transactionId) { finishedBeforeAck += 1 }
        if let done = unfinished.first(where: { $0.id == transactionId }) { finishedHistory.append(done) }
        unfinished.removeAll { $0.id == transactionId }
        try? await control.finish(transactionId)
    }

    func updates(gate: Generation) -> AsyncStream<PaymentUpdate> {
        let (stream, continuation) = AsyncStream<PaymentUpdate>.makeStream()
        if gate === generation && !gate.dead {
            self.continuation = continuation
            // StoreKit 2 replays history through `Transaction.updates` at launch (July 2025).
            for old in history { continuation.yield(.transaction(old)) }
        } else {
            continuation.finish()
        }
        return stream
    }

    func unfinishedTransactions() -> [StoreTransaction] { unfinished }

    func proof(for transaction: StoreTransaction, refresh: Bool) async throws -> Proof {
        if let jws = transaction.signedTransaction { return .signedTransaction(jws) }
        if receiptProofs.contains(transaction.id) { return .receipt(try await receipt(refresh: refresh)) }
        return .transactionId(transaction.id)
    }

    /// The app receipt: the one last read (stale: it may lack the newest purchase) unless
    /// refreshed, or at random as often as a device reads it anew.
    func receipt(refresh: Bool) async throws -> String {
        if !refresh, let cached = cachedReceipt, noise.chance(faults.staleReceipt) { return cached }
        let fresh = try await control.receipt(appleId: appleId)
        cachedReceipt = fresh
        return fresh
    }

    /// A proxy's answer instead of the server's, at the fault's rate: before the request got
    /// through, or after the server answered.
    func middlebox() -> (before: Int?, after: Int?) {
        requests += 1
        guard !beforePayment, noise.chance(faults.middlebox) else { return (nil, nil) }
        middleboxErrors += 1
        let status = [400, 404, 413, 502][noise.below(4)]
        return noise.chance(0.5) ? (status, nil) : (nil, status)
    }
}
