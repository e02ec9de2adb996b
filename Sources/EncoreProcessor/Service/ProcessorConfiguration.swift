import EncoreEvents
import Foundation
import Kafka

/// Everything the processor needs to run, with the defaults of the `run` command.
public struct ProcessorConfiguration: Sendable {
    /// Connection and any librdkafka property (security, SASL, TLS...); applies to every client.
    public var kafka: KafkaConfiguration
    public var groupID = "encore-processor"
    public var requestsTopic = "encore.purchase-requests"
    public var outcomesTopic = "encore.purchase-outcomes"
    public var entitlementsTopic = "encore.entitlement-changes"
    public var deadLetterTopic = "encore.dead-letters"
    /// The entitlement ledger's compacted changelog, co-partitioned with the requests topic.
    public var stateTopic = "encore.entitlement-state"
    /// Subscription state reported by other sources (RevenueCat, Superwall...); `nil`: not read.
    public var sourcesTopic: String? = nil
    /// What products grant, and the access rules merging grants with other sources.
    public var catalog = EntitlementCatalog()
    /// The entitlement ledger's grants and change events. Off, the processor publishes outcomes
    /// and dead letters, and the changelog carries the users' request journals only.
    public var ledgerEnabled = true
    /// How long and how many of each user's requests the journal remembers (results and intents).
    public var journal = JournalPolicy()
    /// A request past its `deadline_at_ms` is `not_attempted` without a call. A replay turns it
    /// off: it reproduces what was decided when the request was new.
    public var enforcesDeadlines = true
    /// At-least-once (the default) or exactly-once (Kafka transactions).
    public var guarantee = DeliveryGuarantee.atLeastOnce
    /// This instance's stable name (`--instance-id`; the host name by default, a StatefulSet pod's
    /// name): exactly-once derives the `transactional.id` from it, so a restarted instance fences
    /// its predecessor's open transactions at once, on any broker. ``randomInstanceID`` picks a
    /// new random one per start.
    public var instanceID = ProcessInfo.processInfo.hostName
    /// The value of ``instanceID`` that asks for a random one on every start.
    public static let randomInstanceID = "random"

    /// Exactly-once: the `transactional.id` an explicit `-X transactional.id` gives, else
    /// `<group>-<instance id>` (a new random one per call for ``randomInstanceID``). With several
    /// workers each adds its number.
    var transactionalIDBase: String {
        kafka["transactional.id"]
            ?? "\(groupID)-\(instanceID == Self.randomInstanceID ? String(UInt64.random(in: 0...UInt64.max)) : instanceID)"
    }
    /// Dispatch loops in this process. The one consumer's partitions are split among them by
    /// partition number (a user's requests, sources and ledger state stay on one loop); they share
    /// the consumer, the producer and the buffer, and the in-flight bound is shared out among them.
    public var workers = 1
    /// Controller calls running at once, across users.
    public var maxInFlight = 256
    /// Records held between the consumer and the broker's acknowledgement of their outputs;
    /// reaching it, the consumer stops handing out records (see `KafkaAdmission`).
    public var bufferCapacity = defaultBufferCapacity
    /// 5,000: at the 1,000,000 backlog on Tansu, 172 to 175 MB peak instead of 191 with 10,000, at
    /// the same rate (0 ms, and 20 ms with 1,000 calls in flight).
    public static let defaultBufferCapacity = 5_000
    /// A controller call longer than this is cancelled; once it has returned, it is tried again as a
    /// recovery call (its effect is unknown) while attempts remain, then the request is in doubt
    /// (unless it returned an answer after all): `pending`, reconciled by ``reconciliation``.
    public var callTimeout: Duration = .seconds(30)
    public var retry = RetryPolicy()
    /// How requests in doubt are reconciled (asked again, for how long), and the takeover's hold.
    public var reconciliation = ReconcilePolicy()
    /// How long a revocation or shutdown waits for running calls and their outputs before it
    /// cancels what still runs; by default the call timeout plus 5 s, and never shorter than it.
    /// A revoked partition is not handed over while one of its calls runs, even past this.
    public var drainTimeout: Duration {
        get { explicitDrainTimeout ?? callTimeout + .seconds(5) }
        set { explicitDrainTimeout = newValue }
    }
    private var explicitDrainTimeout: Duration? = nil
    /// How often finished offsets are committed (also on revoke and shutdown). Short, because a
    /// new owner redoes what was finished after the last commit that reached the broker.
    public var commitInterval: Duration = .milliseconds(200)
    /// The local state store's directory (`--state-dir`, docs/STATE.md): the changelog's records
    /// cached on disk with a checkpoint, so that an assignment reads only the changelog's tail.
    /// `nil`: no store, every assignment reads its changelog partitions from the beginning. Each
    /// running instance needs its own.
    public var stateDirectory: String? = nil
    /// The store's block cache, which bounds its memory with its write buffers (32 MiB).
    public var stateCacheBytes = 64 << 20
    /// With a store: at most how many users the instance keeps in memory (its workers share them)
    /// besides those it must (`--state-cache-users`, docs/STATE.md, Users in memory); the others
    /// are read from the store when their records arrive. `nil`: every user of the owned
    /// partitions is in memory. Without a store every user is, whatever this says.
    public var residentUsers: Int? = Self.defaultResidentUsers
    /// 20,000 (about 40 MB): at 5,000,000 users in the store, answering requests of random users,
    /// 50,000 peaked at 345 to 381 MiB (10,563 to 12,678 a second), 20,000 at 282 to 310 MiB
    /// (12,306 to 13,132 a second).
    public static let defaultResidentUsers = 20_000
    /// How long a partition this instance no longer owns stays in the store (a quick hand-back
    /// restores only its tail); then it is dropped.
    public var stateUnownedGrace: Duration = .seconds(600)
    /// `ce_source` of produced records.
    public var source = "/encore-processor"

    public init(kafka: KafkaConfiguration) {
        self.kafka = kafka
    }

    /// librdkafka's upper bound of `max.poll.interval.ms` (24 h).
    static let maximumPollIntervalMs = 86_400_000

    /// librdkafka's `max.poll.interval.ms` when not set: the drain plus a minute, at least
    /// librdkafka's default of five minutes.
    var minimumMaxPollIntervalMs: Int { max(300_000, drainTimeout.milliseconds + 60_000) }

    /// How long past the drain deadline a call that ignores cancellation may hold a revoked
    /// partition (or the shutdown) before the processor stops without handing it over: what is left
    /// of `max.poll.interval.ms`, after which the group gives the partition to another member anyway.
    var stuckCallLimit: Duration {
        let interval = kafka["max.poll.interval.ms"].flatMap { Int($0) } ?? minimumMaxPollIntervalMs
        return .milliseconds(max(1000, interval - drainTimeout.milliseconds - 5000))
    }

    /// Exactly-once restores: how long a transaction left open on the changelog may hold what is
    /// committed short of the end before the restore settles for the committed end. A broker
    /// aborts a transaction older than `transaction.timeout.ms` (the processor's default is 10 s),
    /// so on Kafka the wait outlasts any transaction but a live one; Tansu never aborts one.
    /// `nil` at least once: nothing is read `read_committed`, so no transaction holds a restore.
    var openTransactionWait: Duration? {
        guard guarantee == .exactlyOnce else { return nil }
        return .milliseconds((kafka["transaction.timeout.ms"].flatMap { Int($0) } ?? 10_000) + 5000)
    }

    /// One worker's share: the in-flight bound divided among the workers (rounded up).
    var perWorker: ProcessorConfiguration {
        var share = self
        func divided(_ value: Int) -> Int { (value + workers - 1) / workers }
        share.maxInFlight = divided(maxInFlight)
        return share
    }

    /// Checks values that librdkafka does not (sizes, timeouts) and the librdkafka properties.
    public func validate() throws(ProcessorError) {
        func require(_ condition: Bool, _ option: String, _ message: String) throws(ProcessorError) {
            if !condition { throw ProcessorError(.invalidConfiguration, "\(option): \(message)") }
        }
        try require(maxInFlight >= 1, "max-in-flight", "must be at least 1, got \(maxInFlight)")
        try require((1...64).contains(workers), "workers", "must be between 1 and 64, got \(workers)")
        try require(
            maxInFlight >= workers, "workers", "\(workers) workers need --max-in-flight of at least \(workers)")
        try require(bufferCapacity >= 1, "buffer-size", "must be at least 1, got \(bufferCapacity)")
        try require(callTimeout > .zero, "call-timeout", "must be positive")
        try require(commitInterval > .zero, "commit-interval-ms", "must be positive")
        try require(reconciliation.duration > .zero, "reconcile-for", "must be positive")
        try require(reconciliation.maxInterval > .zero, "reconcile-max-interval-ms", "must be positive")
        try require(reconciliation.clockSkewMargin >= .zero, "clock-skew-margin-ms", "must not be negative")
        // A request in doubt holds its partition's commit; a re-read of what follows it is answered
        // by the journal, which must remember that long.
        try require(
            Int64(reconciliation.duration.milliseconds) <= journal.retentionMs, "reconcile-for",
            "must not be longer than --dedupe-retention (\(journal.retentionMs) ms): a request in doubt holds its partition's commit, and what a restart reads again past it is answered by the journal"
        )
        // An in-doubt request's journal entry is touched by every ask: it must outlive the waits.
        try require(
            Int64((reconciliation.maxInterval + callTimeout).milliseconds) < journal.retentionMs,
            "reconcile-max-interval-ms",
            "plus --call-timeout-ms must be shorter than --dedupe-retention (\(journal.retentionMs) ms), so an in-doubt request stays in its user's journal between asks"
        )
        try require(
            drainTimeout > callTimeout, "drain-timeout-ms",
            "must be longer than --call-timeout-ms (\(callTimeout.milliseconds) ms), so a hand-over outlasts every running call; got \(drainTimeout.milliseconds) ms"
        )
        if kafka["max.poll.interval.ms"] == nil {
            // Derived, not given: the drain plus a minute must still be a value librdkafka takes.
            // (Written out from the components: `milliseconds` stops at Int32.max, which would
            // show a drain that overflowed as if it fitted.)
            try require(
                minimumMaxPollIntervalMs <= Self.maximumPollIntervalMs,
                explicitDrainTimeout == nil ? "call-timeout-ms" : "drain-timeout-ms",
                "the drain timeout (\(drainTimeout.components.seconds * 1000 + drainTimeout.components.attoseconds / 1_000_000_000_000_000) ms\(explicitDrainTimeout == nil ? ", the call timeout plus 5 s" : "")) plus a minute is the group's rebalance timeout (max.poll.interval.ms), which librdkafka caps at \(Self.maximumPollIntervalMs) ms (24 h)"
            )
        }
        if let value = kafka["max.poll.interval.ms"], let interval = Int(value) {
            try require(
                interval > drainTimeout.milliseconds, "max.poll.interval.ms",
                "must be longer than the drain timeout (\(drainTimeout.milliseconds) ms): it is the group's rebalance timeout, and a member may take the drain timeout to hand its partitions over; got \(interval)"
            )
        }
        try require(!groupID.isEmpty, "group-id", "must not be empty")
        try require(journal.retentionMs >= 60_000, "dedupe-retention", "must be at least a minute")
        try require(
            !instanceID.isEmpty && instanceID.count <= 200
                && instanceID.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) },
            "instance-id", "'\(instanceID)' must be 1 to 200 letters, digits, '.', '_' or '-'")
        try require(
            (1...EntitlementStateRecord.RequestEntry.maximumCount).contains(journal.perUserCap), "dedupe-per-user",
            "must be between 1 and \(EntitlementStateRecord.RequestEntry.maximumCount), got \(journal.perUserCap)")
        for (name, topic) in [
            ("requests-topic", requestsTopic), ("outcomes-topic", outcomesTopic),
            ("entitlements-topic", entitlementsTopic), ("dead-letter-topic", deadLetterTopic),
            ("state-topic", stateTopic), ("sources-topic", sourcesTopic ?? "unset"),
        ] {
            try require(
                !topic.isEmpty && topic.count <= 249
                    && topic.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) },
                name, "'\(topic)' is not a valid Kafka topic name")
        }
        let outputs = [outcomesTopic, entitlementsTopic, deadLetterTopic, stateTopic]
        try require(
            !outputs.contains(requestsTopic) && Set(outputs).count == outputs.count, "requests-topic",
            "the requests, outcomes, entitlements, dead-letter and state topics must all differ")
        if let sourcesTopic {
            try require(ledgerEnabled, "sources-topic", "needs the entitlement ledger (drop --no-ledger)")
            try require(
                sourcesTopic != requestsTopic && !outputs.contains(sourcesTopic), "sources-topic",
                "must differ from the requests and output topics")
            // Only the range assignor gives one member the same partitions of both topics, so the
            // member that owns a user's requests also owns the user's source states.
            let strategy = kafka["partition.assignment.strategy"] ?? "range"
            try require(
                strategy == "range", "sources-topic",
                "needs -X partition.assignment.strategy=range (got '\(strategy)'): a member must own the same partitions of the requests and sources topics"
            )
        }
        // Intents, results and outputs must be durable when acknowledged.
        try require(
            ["all", "-1"].contains(kafka["acks"] ?? "all"), "acks",
            "must be all (-1): an intent or outcome acknowledged by one replica can be lost; got \(kafka["acks"] ?? "")"
        )
        try require(
            kafka["enable.idempotence"] ?? "true" == "true", "enable.idempotence",
            "must stay true: a retried produce could write a changelog record twice or out of order")
        do {
            try kafka.validate()
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}

/// What the processor promises about its outputs when it or the broker fails.
public enum DeliveryGuarantee: String, Sendable, CaseIterable {
    /// Outputs acknowledged before offsets are committed; a crash may publish a record's outputs
    /// again (the same content), never lose them.
    case atLeastOnce = "at-least-once"
    /// Outputs, changelog records and offsets commit in one Kafka transaction per batch; a
    /// `read_committed` reader sees each output once.
    case exactlyOnce = "exactly-once"
}

/// An error of the processor layer.
public struct ProcessorError: Error, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable {
        public let name: String
        public static let invalidConfiguration = Code(name: "invalid_configuration")
        public static let kafka = Code(name: "kafka")
        public static let outputLost = Code(name: "output_lost")
        /// Exactly-once: another producer with this instance's `transactional.id` fenced it.
        public static let fenced = Code(name: "fenced")
        /// A controller call ignored cancellation past the hand-over limit: the processor stops
        /// without handing its partitions over; exit the process so the call ends with it.
        public static let callStuck = Code(name: "call_stuck")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
