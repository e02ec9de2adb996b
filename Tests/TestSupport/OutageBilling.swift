import EncoreProcessor
import Synchronization

/// A billing service with an outage window, as the processor meets one: during the outage billing
/// accepts each call, charges the request on its first call, and answers nothing (the call hangs
/// until the processor gives up on it; billing goes on working on it until the outage ends). Once
/// it recovers, every call (a recovery included) answers what billing recorded for the request.
///
/// It records what a test must judge: the result billing charged per request, calls per request,
/// repeats not declared as recoveries, and overlaps: a call for one of a user's requests while
/// billing still works on another of the user's requests.
public final class OutageBilling: PurchaseController {
    public struct State: Sendable {
        public var inOutage: Bool
        /// What billing recorded per request id (charged on the request's first call).
        public var charged: [String: PurchaseResult] = [:]
        public var callsByRequest: [String: Int] = [:]
        public var calls = 0
        public var recoveryCalls = 0
        /// Requests called again without `isRecovery`: what must never happen.
        public var undeclaredRepeats: [String] = []
        /// `user: request A while B` for each call of a user's request while billing still
        /// worked on another of the user's requests.
        public var overlaps: [String] = []
        /// The requests billing works on now, per user: a call held by the outage stays here
        /// until the outage ends, even after the processor gave up on it.
        var working: [String: [String: Int]] = [:]
        var heldWork: [(user: String, id: String)] = []
        var waiters: [Int: CheckedContinuation<Bool, Never>] = [:]
        var nextTicket = 0
    }

    public let state: Mutex<State>
    /// What billing answers a request it charges.
    public let result: @Sendable (PurchaseRequest) -> PurchaseResult

    public init(
        inOutage: Bool = false, result: @escaping @Sendable (PurchaseRequest) -> PurchaseResult = { _ in .purchased }
    ) {
        state = Mutex(State(inOutage: inOutage))
        self.result = result
    }

    public var snapshot: State { state.withLock { $0 } }

    public func startOutage() { state.withLock { $0.inOutage = true } }

    /// Billing answers again: every call held by the outage returns; those the processor gave
    /// up on are finished too.
    public func endOutage() {
        let waiters = state.withLock { state in
            state.inOutage = false
            for (user, id) in state.heldWork { state.finish(user, id) }
            state.heldWork = []
            defer { state.waiters = [:] }
            return state.waiters.values
        }
        for waiter in waiters { waiter.resume(returning: false) }
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        let (user, id) = (request.appUserId, request.requestId)
        let ticket: Int? = state.withLock { state in
            state.calls += 1
            if request.isRecovery { state.recoveryCalls += 1 }
            if state.callsByRequest[id] != nil && !request.isRecovery { state.undeclaredRepeats.append(id) }
            state.callsByRequest[id, default: 0] += 1
            for (other, _) in state.working[user, default: [:]] where other != id {
                state.overlaps.append("\(user): \(id) while \(other)")
            }
            state.working[user, default: [:]][id, default: 0] += 1
            if state.charged[id] == nil { state.charged[id] = result(request) }
            guard state.inOutage else { return nil }
            state.heldWork.append((user, id))
            state.nextTicket += 1
            return state.nextTicket
        }
        guard let ticket else {
            return state.withLock { state in
                state.finish(user, id)
                return state.charged[id]!
            }
        }
        // Billing answers nothing until the outage ends; a caller that gives up gets an error
        // (billing goes on working on the call until the outage ends).
        let gaveUp = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                // (Cancelled before it waited: the handler found no waiter to resume.)
                let resumeNow: Bool? = state.withLock { state in
                    if Task.isCancelled { return true }
                    guard state.inOutage else { return false }
                    state.waiters[ticket] = continuation
                    return nil
                }
                if let resumeNow { continuation.resume(returning: resumeNow) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: ticket) }?.resume(returning: true)
        }
        if gaveUp { throw CancellationError() }
        return state.withLock { $0.charged[id]! }
    }
}

extension OutageBilling.State {
    mutating func finish(_ user: String, _ id: String) {
        working[user]![id]! -= 1
        if working[user]![id]! == 0 { working[user]![id] = nil }
    }
}
