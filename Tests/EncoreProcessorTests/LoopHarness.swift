import EncoreEvents
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

@testable import EncoreProcessor

/// Records what the loop asks of the consumer.
final class FakeConsumer: ConsumerControl {
    struct State {
        var paused = Set<KafkaTopicPartition>()
        var pauseCount = 0
        var stored: [KafkaTopicPartition: Int64] = [:]
        var storedHistory: [Int64] = []
        var metadata: [KafkaTopicPartition: String?] = [:]
    }
    let state = Mutex(State())

    func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError) {
        state.withLock {
            $0.paused.formUnion(partitions)
            $0.pauseCount += 1
        }
    }

    func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        state.withLock { state in
            for offset in offsets {
                state.stored[offset.topicPartition] = offset.offset
                state.storedHistory.append(offset.offset)
                state.metadata[offset.topicPartition] = offset.metadata
            }
        }
    }

    var snapshot: State { state.withLock { $0 } }
}

/// Acknowledges produced records asynchronously (in batches, as the real producer does), or fails
/// the first ones when told to.
final class FakeProducer: OutputProducer {
    private let records = Mutex<[KafkaProducerRecord]>([])
    private let failures = Mutex<[KafkaError]>([])
    private let refusals = Mutex<[KafkaError]>([])
    private let calls = Mutex<[KafkaProducerRecord]>([])
    private let queue = DispatchQueue(label: "fake.producer")
    private let onDeliveries: @Sendable ([KafkaDelivery]) -> Void
    /// Topics whose acknowledgements are held back, and the held deliveries.
    private let held = Mutex<(topics: Set<String>, deliveries: [(KafkaProducerRecord, UInt)])>(([], []))

    init(onDeliveries: @escaping @Sendable ([KafkaDelivery]) -> Void) {
        self.onDeliveries = onDeliveries
    }

    func failNext(_ errors: [KafkaError]) { failures.withLock { $0 += errors } }

    /// The next `count` produce calls throw `error` (a full local queue, say): the record is not
    /// taken at all.
    func refuseNext(_ count: Int, with error: KafkaError) {
        refusals.withLock { $0 += Array(repeating: error, count: count) }
    }

    /// Holds back the broker's acknowledgement of records of `topic` until ``release(_:)``.
    func hold(_ topic: String) { held.withLock { _ = $0.topics.insert(topic) } }

    /// Acknowledges what was held for `topic` and stops holding it.
    func release(_ topic: String) {
        let deliveries = held.withLock { held in
            held.topics.remove(topic)
            defer { held.deliveries = [] }
            return held.deliveries
        }
        queue.async { [self] in onDeliveries(deliveries.map { acknowledge($0.0, token: $0.1, failure: nil) }) }
    }

    func produce(_ buffer: borrowing KafkaRecordBuffer, token: UInt) throws(KafkaError) {
        if let refusal = refusals.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) { throw refusal }
        let record = buffer.record
        calls.withLock { $0.append(record) }
        let failure = failures.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        let holding = held.withLock { held in
            guard held.topics.contains(record.topic) else { return false }
            held.deliveries.append((record, token))
            return true
        }
        if holding { return }
        queue.async { [self] in onDeliveries([acknowledge(record, token: token, failure: failure)]) }
    }

    private func acknowledge(_ record: KafkaProducerRecord, token: UInt, failure: KafkaError?) -> KafkaDelivery {
        if let failure { return KafkaDelivery(token: token, error: failure, record: record) }
        records.withLock { $0.append(record) }
        return KafkaDelivery(token: token, error: nil, record: nil)
    }

    /// Records handed to the producer, acknowledged or not, in order.
    var handedOver: [KafkaProducerRecord] { calls.withLock { $0 } }

    var produced: [KafkaProducerRecord] { records.withLock { $0 } }

    func outcomes(topic: String = "encore.purchase-outcomes") -> [PurchaseOutcomeEvent] {
        produced.filter { $0.topic == topic }.map { try! PurchaseOutcomeEvent(jsonBytes: $0.value) }
    }

    func deadLetters(topic: String = "encore.dead-letters") -> [DeadLetterEvent] {
        produced.filter { $0.topic == topic }.map { try! DeadLetterEvent(jsonBytes: $0.value) }
    }

    /// The request journal's records on the changelog, in order.
    func journal(topic: String = "encore.entitlement-state") -> [JournalRecord] {
        produced.filter { $0.topic == topic && JournalRecord.isJournalKey($0.key) }.map {
            try! JournalRecord(jsonBytes: $0.value)
        }
    }

    /// The users' state records on the changelog, in order.
    func states(topic: String = "encore.entitlement-state") -> [EntitlementStateRecord] {
        produced.filter { $0.topic == topic && !JournalRecord.isJournalKey($0.key) }.map {
            try! EntitlementStateRecord(jsonBytes: $0.value)
        }
    }
}

/// Set once, when the harness's loop has ended.
final class EndedFlag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
}

/// Runs a ``WorkerExecutor`` and its ``Worker`` against fakes: the dispatcher without Kafka.
final class LoopHarness: Sendable {
    static let topic = "encore.purchase-requests"
    let consumer = FakeConsumer()
    let producer: FakeProducer
    let recorder = StatisticsRecorder()
    let inbox = Inbox<ProcessorInput>()
    private let pump: Task<ProcessorError?, Never>
    private let endedFlag = EndedFlag()
    private let finishedFlag = EndedFlag()
    /// Whether the loop has ended (and its transaction, if any, was seen to).
    var hasEnded: Bool { endedFlag.isSet }
    /// Whether the loop stopped handling its inbox: what it started may still be in flight.
    var hasStoppedHandling: Bool { finishedFlag.isSet }
    private let offsets = Mutex<[Int32: Int64]>([:])
    /// Counts what the harness feeds as the consumer would; the loop releases it.
    let admission: KafkaAdmission

    init(
        configure: (inout ProcessorConfiguration) -> Void = { _ in }, router: PurchaseRouter,
        committer makeCommitter: ((FakeProducer) -> any TransactionCommitter)? = nil
    ) {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        configuration.retry = RetryPolicy(
            maxAttempts: 3, initialBackoff: .milliseconds(5), maxBackoff: .milliseconds(20))
        // The whole suite's load can keep an acknowledgement in the inbox for seconds, and a call
        // whose intent was durable that late would be asked as a recovery after a next owner's
        // hold (``ReconcilePolicy/launchAllowance``): a wide margin keeps each test's calls what
        // it says. Tests of takeover holds and late intents set their own.
        configuration.reconciliation.clockSkewMargin = .seconds(600)
        configure(&configuration)
        let inbox = self.inbox
        producer = FakeProducer { inbox.post(.delivered($0)) }
        let (consumer, producer, recorder, endedFlag, finishedFlag) = (
            self.consumer, self.producer, self.recorder, self.endedFlag, self.finishedFlag
        )
        let committer = makeCommitter?(producer)
        let admission = KafkaAdmission(capacity: configuration.bufferCapacity)
        self.admission = admission
        pump = Task { [configuration] in
            let loop = WorkerExecutor(
                configuration: configuration, router: router, recorder: recorder, consumer: consumer,
                producer: producer, inbox: inbox, admission: admission, logger: Logger(label: "test.loop"),
                committer: committer)
            // The driver of production: as a processor's worker ends, the commit in flight
            // returns and an open transaction aborts.
            await loop.run(stopped: { finishedFlag.set() })
            endedFlag.set()
            return loop.failure
        }
        ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(5))
                inbox.post(.tick)
            }
        }
    }

    private let ticker: Task<Void, Never>

    /// Assigns partitions as a new owner would, with what a previous owner finished beyond its commit.
    func assign(
        partitions: Int32, finished: [Int32: Set<Int64>], restored: [Int32: [EntitlementStateRecord]] = [:],
        committed: [Int32: KafkaTopicPartitionOffset] = [:], alsoOf topics: [String] = []
    ) {
        inbox.post(
            .assigned(
                ([Self.topic] + topics).flatMap { topic in
                    (0..<partitions).map { KafkaTopicPartition(topic: topic, partition: $0) }
                },
                finished: Dictionary(
                    uniqueKeysWithValues: finished.map { (InputPartition.requests($0.key), $0.value) }),
                restored: restored.mapValues { states in
                    var partition = RestoredPartition(journalCap: JournalPolicy().perUserCap)
                    partition.states = Dictionary(states.map { ($0.key, $0) }, uniquingKeysWith: { $1 })
                    return partition
                },
                committed: Dictionary(
                    uniqueKeysWithValues: committed.map { (InputPartition.requests($0.key), $0.value) })))
    }

    func assign(partitions: Int32) {
        assign(partitions: partitions, finished: [:])
    }

    /// Assigns as the forwarder does after a restart or rebalance: the users' state and request
    /// journals restored from the latest changelog record of each user produced so far.
    func assignRestoringChangelog(partitions: Int32) {
        assign(restored: Self.restore(producer.produced), partitions: partitions)
    }

    /// Assigns with a restore as the forwarder reads it (``restore(_:journal:)``).
    func assign(restored: [Int32: RestoredPartition], partitions: Int32) {
        inbox.post(
            .assigned(
                (0..<partitions).map { KafkaTopicPartition(topic: Self.topic, partition: $0) }, finished: [:],
                restored: restored, committed: [:]))
    }

    /// The changelog records among `records`, folded as a restore reads them.
    static func restore(
        _ records: [KafkaProducerRecord], journal: JournalPolicy = JournalPolicy()
    ) -> [Int32: RestoredPartition] {
        var restored: [Int32: RestoredPartition] = [:]
        for record in records where record.topic == "encore.entitlement-state" {
            try! restored[record.partition ?? 0, default: RestoredPartition(journalCap: journal.perUserCap)].fold(
                key: record.key, value: record.value, horizonMs: .min)
        }
        return restored
    }

    /// Revokes `partitions` of the requests topic as the consumer would; returns the offsets the
    /// loop handed over with them, once it did.
    func revoke(_ partitions: [Int32]) async -> [KafkaTopicPartitionOffset] {
        await withCheckedContinuation { continuation in
            inbox.post(
                .revoked(
                    partitions.map { KafkaTopicPartition(topic: Self.topic, partition: $0) },
                    { offsets, _ in continuation.resume(returning: offsets) }))
        }
    }

    /// Feeds one record to `partition` of `topic` at the next offset of that partition, as the
    /// consumer's forwarder does (decoded off the loop).
    func feed(_ value: [UInt8], key: String, partition: Int32 = 0, topic: String = LoopHarness.topic) {
        let offset = offsets.withLock { offsets in
            let slot = topic == Self.topic ? partition : -1 - partition
            defer { offsets[slot, default: 0] += 1 }
            return offsets[slot, default: 0]
        }
        feed(
            KafkaMessage(
                topic: topic, partition: partition, offset: offset, key: Array(key.utf8), value: value,
                headers: [KafkaHeader(key: "trace", string: "t-\(offset)")]))
    }

    /// Feeds `message` as it is (a record handed out again keeps its offset).
    func feed(_ message: KafkaMessage) {
        admission.admit(1)
        inbox.post(.records([IncomingRecord(message: message, isSource: message.topic != Self.topic)]))
    }

    func feed(_ request: PurchaseRequestEvent, partition: Int32 = 0) {
        feed(request.jsonBytes(), key: request.key, partition: partition)
    }

    var statistics: ProcessorStatistics { recorder.snapshot }

    /// Waits until `count` records finished. The deadline is generous: the whole suite starts at
    /// once on two cores, and a loop of a debug build then gets a small share of them for a minute
    /// or more; what a test promises is checked after the wait, never its speed.
    func waitForFinished(_ count: Int, timeout: Duration = .seconds(180)) async -> Bool {
        await eventually(timeout: timeout) { self.statistics.finished >= count }
    }

    /// Waits for the loop to end on its own; returns its failure.
    func ended() async -> ProcessorError? {
        let failure = await pump.value
        ticker.cancel()
        await ticker.value
        return failure
    }

    func stop() async {
        inbox.post(.shutdown)
        _ = await ended()
    }
}

func request(_ index: Int, user: String, product: String = "rc_pro_monthly", app: String = "app")
    -> PurchaseRequestEvent
{
    PurchaseRequestEvent(
        requestID: "req-\(index)", appID: app, appUserID: user, productID: product, store: .appStore,
        environment: .production, requestedAtMs: 1_764_475_643_000 + Int64(index))
}

func router(_ controller: any PurchaseController, routes: [PurchaseRouter.Match] = [.any]) -> PurchaseRouter {
    var router = PurchaseRouter()
    router.register("recording", controller)
    for match in routes { router.route(match, to: "recording") }
    return router
}
