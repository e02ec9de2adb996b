import EncoreEvents
import EncoreProcessor
import Synchronization

/// Answers each request with the outcome production recorded for it, and never calls billing:
/// how `replay` reprocesses a range. A request without a recorded outcome is `not_attempted`
/// (``PurchaseNotAttempted``, type `no_recorded_outcome`).
public final class RecordedController: ReplayingController {
    /// What production answered one request.
    public struct Recording: Sendable, Hashable {
        public var result: OutcomeResult
        public var error: PurchaseOutcomeEvent.Failure?
        public var completedAtMs: Int64

        public init(_ outcome: PurchaseOutcomeEvent) {
            result = outcome.result
            error = outcome.error
            completedAtMs = outcome.completedAtMs
        }
    }

    private let recordings: [String: Recording]
    private let counts = Mutex<(answered: Int, unrecorded: Int)>((0, 0))

    /// `recordings`: by request id.
    public init(recordings: [String: Recording]) {
        self.recordings = recordings
    }

    /// Requests answered from a recording, and requests without one.
    public var calls: (answered: Int, unrecorded: Int) { counts.withLock { $0 } }

    public func recordedCompletion(of request: PurchaseRequest) -> Int64? {
        recordings[request.requestId]?.completedAtMs
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        guard let recording = recordings[request.requestId] else {
            counts.withLock { $0.unrecorded += 1 }
            throw PurchaseNotAttempted(
                type: "no_recorded_outcome",
                message:
                    "production published no outcome for request \(request.requestId); a replay never calls billing")
        }
        counts.withLock { $0.answered += 1 }
        switch recording.result {
        case .purchased: return .purchased
        case .cancelled: return .cancelled
        case .pending: return .pending
        case .failed:
            let error = recording.error ?? .init(type: "failed", message: "", retryable: false)
            // Final: a replay answers once, as production finally did.
            throw PurchaseControllerError.final(error.type, error.message)
        case .notAttempted:
            throw PurchaseNotAttempted(
                type: recording.error?.type ?? "not_attempted",
                message: recording.error?.message ?? "production did not attempt this purchase")
        }
    }
}
