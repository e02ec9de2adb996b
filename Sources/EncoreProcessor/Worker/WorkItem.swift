import EncoreEvents
import Foundation
import Kafka

/// An output as the worker decides it; its executor encodes it and hands its bytes to the producer.
enum UnsentOutput: Sendable {
    /// `trace`: the request record's W3C trace context headers, copied onto the output.
    case outcome(PurchaseOutcomeEvent, trace: [KafkaHeader] = [])
    case change(EntitlementChangeEvent, trace: [KafkaHeader] = [])
    case state(EntitlementStateRecord, partition: Int32)
    /// A request journal entry, to the changelog partition of the user's requests.
    case journal(JournalRecord, partition: Int32)
    case deadLetter(DeadLetterEvent, key: [UInt8]?, trace: [KafkaHeader] = [])
    /// Already encoded (produced again after a failed delivery).
    case record(KafkaProducerRecord)
}

/// What a produced record was, for statistics and the ledger's write order.
enum Output: Sendable {
    case outcome(OutcomeResult, requestedAtMs: Int64)
    case deadLetter
    /// A change event of the ledger update `update`.
    case entitlementChange(update: Int)
    /// The changelog record of the ledger update `update`.
    case entitlementState(update: Int)
}

/// A valid request from its arrival until its outputs are acknowledged: a class, since queues and
/// the call table move it around and the loop sets its call in place. Owned by the loop.
final class WorkItem {
    let ref: RecordRef
    let request: PurchaseRequestEvent
    let message: KafkaMessage
    /// The user's lane and the request's key in the journal.
    let identity: JournalIdentity
    /// The record's trace context, passed to the call and onto every output.
    let trace: TraceContext
    /// One lane per user.
    var lane: UserLane { identity.user }
    /// The attempt number of the first call this process makes: 1, or one past the attempts of
    /// the intent an earlier process recorded (a recovery).
    var firstAttempt = 1
    /// A failure the loop decided and journaled; published once that record is durable.
    var decidedFailure: (error: PurchaseOutcomeEvent.Failure, attempts: Int, completedAtMs: Int64)? = nil
    /// The request's content digest, journaled with its intent (a reused id with other content
    /// is a conflict).
    let digest: String
    /// Its first intent is out and its call not yet in the call table: it takes a place of the
    /// worker's intents ahead of the calls (``Worker/intentWindow``).
    var holdsPlaceAhead = false
    /// A recovery found at takeover: its first call waits until an earlier owner's call could
    /// no longer be running (the intent's time, the call timeout and the clock-skew margin).
    var takeoverHold: ContinuousClock.Instant? = nil
    /// When this process wrote the intent of the request's first call (its `started_at_ms`).
    var intentAt: ContinuousClock.Instant? = nil
    /// When the request went in doubt (its `pending` outcome published), and until when it is
    /// reconciled; `nil` while it is not in doubt.
    var inDoubtSinceMs: Int64? = nil
    var inDoubtUntil: ContinuousClock.Instant? = nil
    var inDoubtFor: Duration = .zero
    /// The call whose attempt's intent is being written; it launches once that is durable.
    var journalingCall: (call: Int, attempt: Int)? = nil

    /// The routed controller, once the call started.
    var controllerName = ""
    var controller: (any PurchaseController)? = nil
    /// The user's lane was handed to the next request when this one's outputs were acknowledged,
    /// before its changelog record (``Worker/resultReady(_:)``).
    var laneReleased = false
    /// When the record arrived, when its user's lane let it start, when its first intent was
    /// durable (exactly-once: committed) and when its first outputs were acknowledged
    /// (``ProcessorStatistics/stages``).
    var times: RequestTimes

    /// `lane`: the request's user's lane (`nil`: built here).
    init(
        ref: RecordRef, request: consuming PurchaseRequestEvent, message: KafkaMessage,
        receivedAt: ContinuousClock.Instant, lane: UserLane? = nil
    ) {
        self.ref = ref
        times = RequestTimes(received: receivedAt)
        self.message = message
        trace = message.hasHeaders ? TraceContext(message.headerBuffer) : TraceContext()
        self.identity = JournalIdentity(
            user: lane ?? UserLane(appID: request.appID, appUserID: request.appUserID), requestID: request.requestID)
        self.digest = request.contentDigest
        // (Last, and moved: stored first, the request was copied for the reads above.)
        self.request = request
    }
}

func currentTimeMs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}
