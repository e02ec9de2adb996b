import EncoreProcessor
import Synchronization

/// A controller that records concurrency and per-user order, with a latency per request and an
/// optional gate that holds calls until opened.
public final class RecordingController: PurchaseController {
    /// What the controller saw: calls per user and request, concurrency, cancellations.
    public struct State {
        public var running = 0
        public var maxRunning = 0
        public var runningUsers = Set<String>()
        public var overlaps: [String] = []
        public var callsByUser: [String: [String]] = [:]
        public var callsByRequest: [String: Int] = [:]
        public var calls = 0
        /// Calls the processor cancelled.
        public var cancelled = 0
        /// Calls that have returned.
        public var returned = 0

        /// Request ids called more than once.
        public var repeated: [String] { callsByRequest.filter { $0.value > 1 }.keys.sorted() }
        /// Requests called again without `isRecovery`: what must never happen.
        public var undeclaredRepeats: [String] = []
        /// Calls that carried `isRecovery`, in all and per request.
        public var recoveryCalls = 0
        public var recoveriesByRequest: [String: Int] = [:]
    }
    public let state = Mutex(State())
    public let latency: @Sendable (PurchaseRequest) -> Duration
    public let gate: Gate?
    public let answer: @Sendable (PurchaseRequest) throws -> PurchaseResult

    public init(
        latency: @escaping @Sendable (PurchaseRequest) -> Duration = { _ in .zero }, gate: Gate? = nil,
        answer: @escaping @Sendable (PurchaseRequest) throws -> PurchaseResult = { _ in .purchased }
    ) {
        self.latency = latency
        self.gate = gate
        self.answer = answer
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        let user = request.appUserId
        state.withLock { state in
            state.calls += 1
            state.running += 1
            state.maxRunning = max(state.maxRunning, state.running)
            if !state.runningUsers.insert(user).inserted { state.overlaps.append(user) }
            state.callsByUser[user, default: []].append(request.requestId)
            if state.callsByRequest[request.requestId] != nil && !request.isRecovery {
                state.undeclaredRepeats.append(request.requestId)
            }
            if request.isRecovery {
                state.recoveryCalls += 1
                state.recoveriesByRequest[request.requestId, default: 0] += 1
            }
            state.callsByRequest[request.requestId, default: 0] += 1
        }
        defer {
            state.withLock { state in
                state.running -= 1
                state.returned += 1
                state.runningUsers.remove(user)
            }
        }
        if let gate {
            // The gate ignores cancellation (a controller that goes on regardless); it is counted.
            await withTaskCancellationHandler {
                await gate.wait(request)
            } onCancel: {
                state.withLock { $0.cancelled += 1 }
            }
        }
        let delay = latency(request)
        if delay > .zero { try await Task.sleep(for: delay) }
        return try answer(request)
    }

    public var snapshot: State { state.withLock { $0 } }
}

/// Holds calls for which `holds` is true until ``open()``.
public final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
    public let holds: @Sendable (PurchaseRequest) -> Bool

    public init(holds: @escaping @Sendable (PurchaseRequest) -> Bool = { _ in true }) {
        self.holds = holds
    }

    public func wait(_ request: PurchaseRequest) async {
        guard holds(request) else { return }
        await withCheckedContinuation { continuation in
            let resumeNow = state.withLock { state in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    public var waiting: Int { state.withLock { $0.waiters.count } }

    public func open() {
        let waiters = state.withLock { state in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
