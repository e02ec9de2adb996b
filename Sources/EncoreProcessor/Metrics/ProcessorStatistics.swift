import EncoreEvents
import Kafka
import Synchronization

/// Counters of a running processor, readable from any thread.
public struct ProcessorStatistics: Sendable {
    /// Records read from the requests topic (and the sources topic, when one is read).
    public var received = 0
    /// Records read from the sources topic that were valid.
    public var sourceEvents = 0
    /// Entitlement change events delivered.
    public var entitlementChanges = 0
    /// Outcomes delivered, by result.
    public var outcomes: [OutcomeResult: Int] = [:]
    /// Dead letters delivered (invalid input and failed requests).
    public var deadLetters = 0
    /// Invalid records (a subset of dead letters).
    public var invalid = 0
    /// Requests skipped because their user's journal holds their result (a re-send or a redo).
    public var duplicates = 0
    /// Requests whose journal held an intent and no result: an earlier process started them, so
    /// this one called them as recovery calls.
    public var recovered = 0
    /// Controller calls that carried `isRecovery` (every attempt after a request's first).
    public var recoveryCalls = 0
    /// Intents too old to start their call by the time it could start
    /// (``ReconcilePolicy/launchAllowance``): `held`, durable too late (the request waits out a
    /// next owner's hold, then a recovery call asks billing); `rewritten`, its call slot came too
    /// late (the intent is written again before the call).
    public var lateIntents = LateIntents()
    /// Requests that went in doubt (attempts used up, billing's answer unknown: `pending`
    /// with `outcome_unknown` published), that billing then answered (a final outcome
    /// published), and that expired past `--reconcile-for` (dead letter `in_doubt_expired`).
    public var inDoubtOpened = 0
    public var inDoubtResolved = 0
    public var inDoubtExpired = 0
    /// Requests in doubt now, and when the oldest of them went in doubt (epoch ms).
    public var inDoubtOpen = 0
    /// With `--state-cache-users`: users in memory, users read from the state store, users let go
    /// (kept in the store only).
    public var residentUsers = 0
    public var userLoads = 0
    public var userEvictions = 0
    public var oldestInDoubtSinceMs: Int64? = nil
    /// Recovery calls asking billing about a request in doubt.
    public var reconcileCalls = 0
    /// Records reusing a journaled `request_id` with other content (dead letter `request_id_conflict`).
    public var requestIDConflicts = 0
    /// Exactly-once: transactions committed (or attempted).
    public var transactions = 0
    /// Exactly-once: transactions left open when a worker stopped (a failure, a failed commit, a
    /// drain that timed out) and aborted then.
    public var abortedTransactions = 0
    /// Records read again after a restart whose failure was journaled before its outcome: the
    /// outcome was published again, identical.
    public var republished = 0
    /// Records skipped because a previous owner of the partition had finished them (commit metadata).
    public var alreadyFinished = 0
    /// Finished records handed over with a commit the broker refused (librdkafka's mock refuses
    /// commits during a rebalance): the next owner processes them again.
    public var redoneAfterHandOver = 0
    /// Outputs produced again after a delivery failed (timed out, broker unreachable).
    public var redelivered = 0
    /// Controller calls made, retries included.
    public var controllerCalls = 0
    /// Requests whose offsets are committable (outcome delivered, duplicate skipped, or dead-lettered).
    public var finished = 0
    /// Request time → outcome delivered, in microseconds.
    public var latency = LatencyHistogram()
    /// Partitions of the requests topic this member owns now.
    public var assignedPartitions = 0
    /// Highest number of controller calls seen running at once.
    public var peakInFlight = 0
    /// Wall-clock milliseconds of the first record received and of the last record finished.
    /// Outcomes published, by result and controller (`-` when none was called).
    public var outcomesByController: [Labels: Int] = [:]
    /// Outcomes of requests a load test produced (`attributes.encore_loadtest_run`).
    public var loadTestOutcomes = 0
    /// Controller calls that ended with an error, by error type.
    public var controllerErrors: [String: Int] = [:]
    /// Calls that retried an attempt of this process.
    public var retries = 0
    /// Dead letters published, by stage and error class.
    public var deadLettersByClass: [Labels: Int] = [:]
    /// Entitlement changes published, by kind.
    public var changesByKind: [String: Int] = [:]
    /// How long controller calls took, in microseconds.
    public var callDuration = LatencyHistogram()
    /// Where the time of requests in the processor went, stage by stage.
    public var stages = RequestStages()
    /// Controller calls running now.
    public var inFlight = 0
    /// Offset commits that failed (retried at the next interval).
    public var commitFailures = 0
    /// When the loop last ticked (it ticks every commit interval): how `/healthz` knows it is alive.
    public var lastTickAtMs: Int64 = 0
    public var firstReceivedAtMs: Int64? = nil
    public var lastFinishedAtMs: Int64? = nil

    /// Finished records per second between the first receipt and the last finish.
    public var throughput: Double {
        guard let first = firstReceivedAtMs, let last = lastFinishedAtMs, last > first else { return 0 }
        return Double(finished) / (Double(last - first) / 1000)
    }

    public var outcomeCount: Int { outcomes.values.reduce(0, +) }

    /// Two label values of a counter (`result`, `controller`; `stage`, `class`).
    public struct Labels: Sendable, Hashable {
        public var first: String
        public var second: String

        public init(_ first: String, _ second: String) {
            self.first = first
            self.second = second
        }
    }

    /// The statistics of several workers as one: counts added, histograms merged, the earliest
    /// first receipt and the latest finish.
    static func combined(_ parts: [ProcessorStatistics]) -> ProcessorStatistics {
        guard var total = parts.first else { return ProcessorStatistics() }
        for part in parts.dropFirst() {
            total.received += part.received
            total.sourceEvents += part.sourceEvents
            total.entitlementChanges += part.entitlementChanges
            total.outcomes.merge(part.outcomes, uniquingKeysWith: +)
            total.deadLetters += part.deadLetters
            total.invalid += part.invalid
            total.duplicates += part.duplicates
            total.recovered += part.recovered
            total.recoveryCalls += part.recoveryCalls
            total.lateIntents.held += part.lateIntents.held
            total.lateIntents.rewritten += part.lateIntents.rewritten
            total.transactions += part.transactions
            total.inDoubtOpened += part.inDoubtOpened
            total.inDoubtResolved += part.inDoubtResolved
            total.inDoubtExpired += part.inDoubtExpired
            total.inDoubtOpen += part.inDoubtOpen
            total.residentUsers += part.residentUsers
            total.userLoads += part.userLoads
            total.userEvictions += part.userEvictions
            total.oldestInDoubtSinceMs = [total.oldestInDoubtSinceMs, part.oldestInDoubtSinceMs].compactMap { $0 }.min()
            total.reconcileCalls += part.reconcileCalls
            total.requestIDConflicts += part.requestIDConflicts
            total.abortedTransactions += part.abortedTransactions
            total.republished += part.republished
            total.alreadyFinished += part.alreadyFinished
            total.redoneAfterHandOver += part.redoneAfterHandOver
            total.redelivered += part.redelivered
            total.controllerCalls += part.controllerCalls
            total.finished += part.finished
            total.latency.merge(part.latency)
            total.assignedPartitions += part.assignedPartitions
            total.peakInFlight += part.peakInFlight
            total.outcomesByController.merge(part.outcomesByController, uniquingKeysWith: +)
            total.loadTestOutcomes += part.loadTestOutcomes
            total.controllerErrors.merge(part.controllerErrors, uniquingKeysWith: +)
            total.retries += part.retries
            total.deadLettersByClass.merge(part.deadLettersByClass, uniquingKeysWith: +)
            total.changesByKind.merge(part.changesByKind, uniquingKeysWith: +)
            total.callDuration.merge(part.callDuration)
            total.stages.merge(part.stages)
            total.inFlight += part.inFlight
            total.commitFailures += part.commitFailures
            // The stalest worker says whether the process is alive.
            total.lastTickAtMs = min(total.lastTickAtMs, part.lastTickAtMs)
            total.firstReceivedAtMs = [total.firstReceivedAtMs, part.firstReceivedAtMs].compactMap { $0 }.min()
            total.lastFinishedAtMs = [total.lastFinishedAtMs, part.lastFinishedAtMs].compactMap { $0 }.max()
        }
        return total
    }
}

/// The processor's live statistics; the processor writes, anyone reads a snapshot.
final class StatisticsRecorder: Sendable {
    private let state = Mutex(ProcessorStatistics())

    func publish(_ statistics: ProcessorStatistics) {
        state.withLock { $0 = statistics }
    }

    var snapshot: ProcessorStatistics { state.withLock { $0 } }
}

/// Where the time of requests in the processor went, summed over the requests that passed every
/// stage (a duplicate, a request failed before its call or one handed over mid-way does not):
/// - `waitingForUser`: from the record's arrival to its start, behind its user's earlier request;
/// - `intent`: to its first intent durable (acknowledged; exactly-once, committed), a recovery's
///   hold for an earlier owner's call included;
/// - `outputs`: to its first outputs acknowledged (its outcome, or its `pending` one when it went
///   in doubt), its wait for a call slot, its call and its retries included;
/// - `resultRecord`: to its result durable in the journal, when its offset may be committed.
///
/// A request's record stays admitted (`--buffer-size`) through all four and a little longer, so
/// the processor finishes at most about the buffer size ÷ the mean total a second.
public struct RequestStages: Sendable, Hashable {
    /// Requests that passed every stage.
    public private(set) var count = 0
    public private(set) var waitingForUser: Duration = .zero
    public private(set) var intent: Duration = .zero
    public private(set) var outputs: Duration = .zero
    public private(set) var resultRecord: Duration = .zero

    public init() {}

    /// Adds a request done at `done`; one that missed a stage is left out.
    mutating func record(_ times: RequestTimes, done: ContinuousClock.Instant) {
        guard times.passedEveryStage else { return }
        count += 1
        waitingForUser += times.received.duration(to: times.started)
        intent += times.started.duration(to: times.intentDurable)
        outputs += times.intentDurable.duration(to: times.outputsAcknowledged)
        resultRecord += times.outputsAcknowledged.duration(to: done)
    }

    mutating func merge(_ other: RequestStages) {
        count += other.count
        waitingForUser += other.waitingForUser
        intent += other.intent
        outputs += other.outputs
        resultRecord += other.resultRecord
    }

    /// Each stage's mean in milliseconds, named as in `bench --json` (`waiting_for_user`, `intent`,
    /// `outputs`, `result_record`); empty before a request passed them all.
    public var meanMilliseconds: [(name: String, milliseconds: Double)] {
        guard count > 0 else { return [] }
        func mean(_ total: Duration) -> Double { Double(total.wholeMicroseconds) / 1000 / Double(count) }
        return [
            ("waiting_for_user", mean(waitingForUser)), ("intent", mean(intent)), ("outputs", mean(outputs)),
            ("result_record", mean(resultRecord)),
        ]
    }
}

/// When one request passed each stage of ``RequestStages``, each stamped the first time only. The
/// instants are not optional (one not stamped yet holds the arrival; `passed` says which are):
/// `ContinuousClock.Instant` is resilient, so an optional one was copied through its value
/// witnesses and `memcpy` at each read, four times a request.
struct RequestTimes {
    let received: ContinuousClock.Instant
    private(set) var started: ContinuousClock.Instant
    private(set) var intentDurable: ContinuousClock.Instant
    private(set) var outputsAcknowledged: ContinuousClock.Instant
    /// The stages stamped: bit 0 started, bit 1 intent durable, bit 2 outputs acknowledged.
    private var passed: UInt8 = 0

    init(received: ContinuousClock.Instant) {
        self.received = received
        (started, intentDurable, outputsAcknowledged) = (received, received, received)
    }

    var passedEveryStage: Bool { passed == 0b111 }

    /// Its user's lane let it start (the first time).
    mutating func start(at now: ContinuousClock.Instant) {
        guard passed & 0b001 == 0 else { return }
        (started, passed) = (now, passed | 0b001)
    }

    /// Its first intent is durable.
    mutating func intentDurable(at now: ContinuousClock.Instant) {
        guard passed & 0b010 == 0 else { return }
        (intentDurable, passed) = (now, passed | 0b010)
    }

    /// Its first outputs are acknowledged.
    mutating func outputsAcknowledged(at now: ContinuousClock.Instant) {
        guard passed & 0b100 == 0 else { return }
        (outputsAcknowledged, passed) = (now, passed | 0b100)
    }
}

/// Intents found too old to start their call (``ProcessorStatistics/lateIntents``).
public struct LateIntents: Sendable, Hashable {
    public var held = 0
    public var rewritten = 0
}
