import EncoreEvents
import Foundation
import Kafka
import Synchronization

/// Reads purchase requests from Kafka, dispatches each to the routed controller, and publishes
/// outcomes and dead letters, committing only offsets whose outputs the broker acknowledged.
///
/// ```swift
/// var router = PurchaseRouter()
/// router.register("revenuecat", RevenueCatController())
/// router.register("storekit", StoreKitController())
/// router.route(.prefix("rc_"), to: "revenuecat")
/// router.route(.any, to: "storekit")
/// let processor = try PurchaseProcessor(configuration: configuration, router: router)
/// try await processor.run()   // until shutdown()
/// ```
public final class PurchaseProcessor: Sendable {
    let configuration: ProcessorConfiguration
    let router: PurchaseRouter
    let logger: Logger
    /// One per dispatch loop (``ProcessorConfiguration/workers``).
    private let workers: [Worker]
    private let hasRun = Atomic<Bool>(false)

    /// A dispatch loop's mailbox and published statistics.
    private final class Worker: Sendable {
        let inbox = Inbox<ProcessorInput>()
        let recorder = StatisticsRecorder()
    }

    public init(
        configuration: ProcessorConfiguration, router: PurchaseRouter,
        logger: Logger = Logger(label: "encore.processor")
    ) throws(ProcessorError) {
        try configuration.validate()
        let missing = router.unregisteredNames
        guard missing.isEmpty else {
            throw ProcessorError(
                .invalidConfiguration,
                "route: no controller registered as \(missing.map { "'\($0)'" }.joined(separator: ", "))")
        }
        self.configuration = configuration
        self.router = router
        self.logger = logger
        workers = (0..<configuration.workers).map { _ in Worker() }
    }

    private var outputTopics: [String] {
        [configuration.outcomesTopic, configuration.deadLetterTopic]
            + (configuration.ledgerEnabled ? [configuration.entitlementsTopic, configuration.stateTopic] : [])
    }

    /// A snapshot of the counters and latency histogram.
    public var statistics: ProcessorStatistics { .combined(workers.map(\.recorder.snapshot)) }

    /// Asks ``run()`` to stop: no new work, running calls finish (within the drain timeout), their
    /// outputs are delivered and offsets committed, then `run()` returns. Safe from any thread.
    public func shutdown() {
        for worker in workers { worker.inbox.post(.shutdown) }
    }

    /// Processes until ``shutdown()`` is called (or the task is cancelled), then drains and returns.
    /// Throws when the processor cannot go on without losing data (an output that cannot be delivered).
    public func run() async throws(ProcessorError) {
        guard !hasRun.exchange(true, ordering: .acquiringAndReleasing) else {
            throw ProcessorError(.invalidConfiguration, "a processor runs once; create a new one")
        }
        try await checkTopics()
        let configuration = self.configuration
        let share = configuration.perWorker
        let workers = self.workers
        let inboxes = workers.map(\.inbox)
        // The consumer counts the records it hands out; the loops release them when done.
        let admission = KafkaAdmission(capacity: configuration.bufferCapacity)
        let clients = try makeClients(admission: admission, inboxes: inboxes)
        // The first outputs would otherwise wait for their topics' metadata (a start-up stall).
        for topic in outputTopics {
            do {
                try await clients.producer.prepare(topic: topic, timeout: .seconds(5))
            } catch {
                logger.warning("cannot read the metadata of '\(topic)' yet: \(error)")
            }
        }
        let inputTopics = [configuration.requestsTopic] + (configuration.sourcesTopic.map { [$0] } ?? [])
        do {
            try clients.consumer.subscribe(topics: inputTopics)
        } catch {
            throw ProcessorError(
                .kafka, "cannot subscribe to \(inputTopics.map { "'\($0)'" }.joined(separator: ", ")): \(error)")
        }
        logger.info(
            "processing \(configuration.requestsTopic) as group '\(configuration.groupID)' (\(workers.count) workers, max in flight \(configuration.maxInFlight))"
        )
        let logger = self.logger
        let forwarder = Task {
            let router = WorkerRouter(count: inboxes.count)
            // Decoding happens here, beside the loops rather than on them.
            for await event in clients.consumer.events {
                switch event {
                case .messages(let messages):
                    let records = messages.map {
                        IncomingRecord(message: $0, isSource: $0.topic == configuration.sourcesTopic)
                    }
                    for (worker, part) in router.split(records, by: { $0.message.partition }) {
                        inboxes[worker].post(.records(part))
                    }
                case .partitionsAssigned(let partitions):
                    // Read before any record of these partitions: what the previous owner finished,
                    // and the ledger state of their users.
                    let finished = await Self.finishedOffsets(
                        of: partitions, configuration: configuration, consumer: clients.consumer, logger: logger)
                    var restored: [Int32: [String: EntitlementStateRecord]] = [:]
                    if configuration.ledgerEnabled {
                        do throws(ProcessorError) {
                            restored = try await Self.restoreLedger(
                                of: partitions.filter { $0.topic == configuration.requestsTopic }.map(\.partition),
                                configuration: configuration, logger: logger)
                        } catch {
                            // Processing without the users' state would overwrite it: stop instead.
                            for inbox in inboxes { inbox.post(.failed(error)) }
                            continue
                        }
                    }
                    for (worker, part) in router.split(partitions, by: \.partition) {
                        let numbers = Set(part.map(\.partition))
                        inboxes[worker].post(
                            .assigned(
                                part, finished: finished.filter { numbers.contains($0.key.number) },
                                restored: restored.filter { numbers.contains($0.key) }))
                    }
                case .partitionsRevoked(let partitions, let revocation):
                    // Each worker hands over its share; the partitions go once all have.
                    let shares = router.split(partitions, by: \.partition)
                    let handOver = RevocationHandOver(revocation, parts: shares.count)
                    for (worker, part) in shares {
                        inboxes[worker].post(.revoked(part, { handOver.acknowledge(committing: $0) }))
                    }
                case .error:
                    for inbox in inboxes { inbox.post(.consumer(event)) }
                }
            }
            for inbox in inboxes { inbox.post(.consumerEnded) }
        }
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(20))
                for inbox in inboxes { inbox.post(.tick) }
            }
        }
        let router = self.router
        let (failure, finalOffsets) = await withTaskGroup(
            of: (ProcessorError?, [KafkaTopicPartitionOffset]).self
        ) { group in
            for (index, worker) in workers.enumerated() {
                group.addTask {
                    // The loop lives and ends in this task: it owns its state alone.
                    let loop = ProcessorLoop(
                        configuration: share, router: router, recorder: worker.recorder, consumer: clients.consumer,
                        producer: WorkerProducer(producer: clients.producer, worker: index, workers: workers.count),
                        inbox: worker.inbox, admission: admission, logger: logger)
                    let failure = await withTaskCancellationHandler {
                        while !loop.isFinished { loop.handle(await worker.inbox.next()) }
                        return loop.failure
                    } onCancel: {
                        worker.inbox.post(.shutdown)
                    }
                    loop.cancelRemainingCalls()
                    await loop.waitForOutputs()
                    await loop.commitTask?.value
                    return (failure, loop.finalCommitOffsets)
                }
            }
            // A worker that cannot go on stops the others: they drain and commit what they did.
            var first: ProcessorError? = nil
            var offsets: [KafkaTopicPartitionOffset] = []
            for await (failure, finalOffsets) in group {
                offsets += finalOffsets
                if let failure, first == nil {
                    first = failure
                    for inbox in inboxes { inbox.post(.shutdown) }
                }
            }
            return (first, offsets)
        }
        ticker.cancel()
        do {
            try await clients.producer.flush(timeout: configuration.drainTimeout)
        } catch {
            logger.error("outputs still undelivered at shutdown: \(error)")
        }
        do {
            if !finalOffsets.isEmpty { try await clients.consumer.commit(finalOffsets) }
        } catch {
            logger.error("final offset commit failed: \(error)")
        }
        await clients.consumer.close()
        forwarder.cancel()
        await forwarder.value
        await ticker.value
        await clients.producer.close(timeout: .seconds(5))
        let statistics = self.statistics
        logger.info(
            "stopped: \(statistics.received) received, \(statistics.outcomeCount) outcomes, \(statistics.deadLetters) dead letters, \(statistics.duplicates) duplicates"
        )
        if let failure { throw failure }
    }

    private static func finishedOffsets(
        of partitions: [KafkaTopicPartition], configuration: ProcessorConfiguration, consumer: KafkaConsumer,
        logger: Logger
    ) async -> [InputPartition: Set<Int64>] {
        do {
            let committed = try await consumer.committed(partitions)
            logger.debug(
                "assigned \(partitions.count) partitions; committed: \(committed.map { "\($0.partition)@\($0.offset)+\(FinishedOffsets.decode($0.metadata, committed: $0.offset).count)" })"
            )
            return Dictionary(
                committed.map { offset in
                    let topic: InputPartition.Topic = offset.topic == configuration.requestsTopic ? .requests : .sources
                    return (
                        InputPartition(topic: topic, number: offset.partition),
                        FinishedOffsets.decode(offset.metadata, committed: offset.offset)
                    )
                },
                uniquingKeysWith: { first, _ in first })
        } catch {
            logger.warning(
                "cannot read committed offsets of the new assignment (\(error)); finished records will be redone")
            return [:]
        }
    }

    /// Reads the users' ledger state of `partitions` from the changelog: the latest record per user.
    /// A record that is not a valid state is skipped (logged); a changelog that cannot be read after
    /// three attempts is an error, since going on without the state would overwrite it.
    private static func restoreLedger(
        of partitions: [Int32], configuration: ProcessorConfiguration, logger: Logger
    ) async throws(ProcessorError) -> [Int32: [String: EntitlementStateRecord]] {
        guard !partitions.isEmpty else { return [:] }
        let clock = ContinuousClock()
        let started = clock.now
        var attempt = 1
        while true {
            do {
                return try await readLedger(
                    of: partitions, configuration: configuration, logger: logger, since: started, clock: clock)
            } catch  where attempt < 3 {
                logger.warning("cannot read the changelog '\(configuration.stateTopic)' (\(error)); trying again")
                try? await Task.sleep(for: .seconds(attempt))
                attempt += 1
            } catch {
                throw ProcessorError(
                    .kafka, "cannot restore the ledger state from '\(configuration.stateTopic)': \(error)")
            }
        }
    }

    private static func readLedger(
        of partitions: [Int32], configuration: ProcessorConfiguration, logger: Logger,
        since started: ContinuousClock.Instant, clock: ContinuousClock
    ) async throws(KafkaError) -> [Int32: [String: EntitlementStateRecord]] {
        let (latest, records) = try await KafkaPartitionReader.fold(
            configuration: configuration.kafka, topic: configuration.stateTopic, partitions: partitions,
            into: [Int32: [String: EntitlementStateRecord]]()
        ) { latest, message in
            do {
                let state = try EntitlementStateRecord(jsonBytes: message.value)
                latest[message.partition, default: [:]][state.key] = state
            } catch {
                // An older valid record of the user, if any, stands.
                Logger(label: "encore.ledger").warning(
                    "changelog record \(message.topic)[\(message.partition)]@\(message.offset) is not a valid state (\(error)); skipped"
                )
            }
        }
        let users = latest.values.reduce(0) { $0 + $1.count }
        logger.info(
            "restored the ledger state of \(users) users from \(records) changelog records of \(partitions.count) partitions in \(clock.now - started)"
        )
        return latest
    }

    /// The ledger's changelog must be co-partitioned with the requests (and the sources topic
    /// too): checked at start; a missing changelog is created, compacted, with the same partitions.
    private func checkTopics() async throws(ProcessorError) {
        var adminConfiguration = configuration.kafka
        // Asking for a missing topic's metadata must not create it with the broker's defaults.
        adminConfiguration["allow.auto.create.topics"] = "false"
        do {
            let admin = try KafkaAdmin(configuration: adminConfiguration, logger: Logger(label: "encore.admin"))
            guard let requests = try await admin.partitionCount(of: configuration.requestsTopic) else {
                throw ProcessorError(
                    .invalidConfiguration,
                    "requests-topic: '\(configuration.requestsTopic)' does not exist (create the topics with `encore-processor topics create`)"
                )
            }
            guard configuration.ledgerEnabled else { return }
            var state = try await admin.partitionCount(of: configuration.stateTopic)
            if state == nil {
                logger.info("creating the ledger's changelog '\(configuration.stateTopic)' with \(requests) partitions")
                try await admin.createTopics([
                    KafkaTopicSpecification(
                        name: configuration.stateTopic, partitions: requests, replicationFactor: -1,
                        configs: ["cleanup.policy": "compact"])
                ])
                state = try await admin.partitionCount(of: configuration.stateTopic)
            }
            for (option, topic, count) in [
                ("state-topic", configuration.stateTopic, state),
                ("sources-topic", configuration.sourcesTopic, nil),
            ] {
                guard let topic else { continue }
                let partitions = option == "state-topic" ? count : try await admin.partitionCount(of: topic)
                guard let partitions else {
                    throw ProcessorError(.invalidConfiguration, "\(option): '\(topic)' does not exist")
                }
                guard partitions == requests else {
                    throw ProcessorError(
                        .invalidConfiguration,
                        "\(option): '\(topic)' has \(partitions) partitions but '\(configuration.requestsTopic)' has \(requests); they must be co-partitioned (same key, same partition count) so one member owns all of a user's records"
                    )
                }
            }
        } catch let error as ProcessorError {
            throw error
        } catch {
            throw ProcessorError(.kafka, "cannot check the topics: \(error)")
        }
    }

    private func makeClients(
        admission: KafkaAdmission, inboxes: [Inbox<ProcessorInput>]
    ) throws(ProcessorError) -> (consumer: KafkaConsumer, producer: KafkaProducer) {
        var producerConfiguration = configuration.kafka
        producerConfiguration.setDefault("enable.idempotence", "true")
        producerConfiguration.setDefault("acks", "all")
        producerConfiguration.setDefault("linger.ms", "5")
        // Java clients' partitioner, so keys land where other producers put them.
        producerConfiguration.setDefault("partitioner", "murmur2_random")
        // The buffer capacity bounds what is queued; never refuse a record locally.
        producerConfiguration.setDefault("queue.buffering.max.messages", "1000000")
        var consumerConfiguration = configuration.kafka
        consumerConfiguration.groupID = configuration.groupID
        // The processor commits itself, with the finished offsets beyond the commit as metadata.
        consumerConfiguration.setDefault("enable.auto.commit", "false")
        if configuration.sourcesTopic != nil {
            // Co-partitioned topics stay together only under the range assignor (checked in validate()).
            consumerConfiguration.setDefault("partition.assignment.strategy", "range")
        }
        // librdkafka's own prefetch (64 MiB by default) adds to the processor's buffer. From 2.1 on,
        // a full prefetch queue is refilled after `fetch.queue.backoff.ms` (1 s by default, an idle
        // second each time); refilled within 10 ms, 4 MiB keep the loops fed (measured on Tansu:
        // 143 MB peak instead of 183 for a 1,000,000 backlog, same throughput). Older versions have
        // no such setting and were measured slower with a small queue, so they keep a deeper one.
        if LibrdkafkaVersion.isAtLeast(2, 1) {
            consumerConfiguration.setDefault("fetch.queue.backoff.ms", "10")
            consumerConfiguration.setDefault("queued.max.messages.kbytes", "4096")
        } else {
            consumerConfiguration.setDefault("queued.max.messages.kbytes", "16384")
        }
        do {
            let producer = try KafkaProducer(
                configuration: producerConfiguration, logger: Logger(label: "encore.producer"),
                onDeliveries: { deliveries in
                    // Each worker's outputs carry its number in the token (see WorkerProducer).
                    for (worker, part) in WorkerProducer.split(deliveries, workers: inboxes.count) {
                        inboxes[worker].post(.delivered(part))
                    }
                })
            let consumer = try KafkaConsumer(
                configuration: consumerConfiguration, revocationTimeout: configuration.drainTimeout + .seconds(5),
                admission: admission, logger: Logger(label: "encore.consumer"))
            return (consumer, producer)
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}

/// Everything that reaches the processor's loop, in one stream so one task owns all state.
enum ProcessorInput: Sendable {
    /// Records already decoded (off the loop's thread).
    case records([IncomingRecord])
    /// Partitions assigned, with the offsets their previous owner finished beyond its commit and
    /// the ledger state of their users, read back from the changelog (by requests partition).
    case assigned(
        [KafkaTopicPartition], finished: [InputPartition: Set<Int64>],
        restored: [Int32: [String: EntitlementStateRecord]])
    case commitFinished
    case commitFailed([InputPartition])
    case consumer(KafkaConsumerEvent)
    case consumerEnded
    case attemptFinished(call: Int, attempt: Int, Result<PurchaseResult, any Error>)
    /// The broker's answers for outputs, by the token they were produced with.
    case delivered([KafkaDelivery])
    /// Partitions being taken away; `acknowledge` hands them over with the offsets to commit.
    case revoked([KafkaTopicPartition], @Sendable ([KafkaTopicPartitionOffset]) -> Void)
    case tick
    case shutdown
    /// The processor cannot go on (the ledger's state could not be restored).
    case failed(ProcessorError)
}

/// A partition the processor reads: of the requests topic, or of the optional sources topic.
struct InputPartition: Hashable, Comparable, Sendable, CustomStringConvertible {
    enum Topic: UInt8, Sendable { case requests, sources }
    var topic: Topic
    var number: Int32

    static func requests(_ number: Int32) -> InputPartition { InputPartition(topic: .requests, number: number) }

    static func < (lhs: InputPartition, rhs: InputPartition) -> Bool {
        (lhs.topic.rawValue, lhs.number) < (rhs.topic.rawValue, rhs.number)
    }

    var description: String { "\(topic == .requests ? "" : "sources:")\(number)" }
}

/// A record of an input partition, within one assignment of the partition.
struct RecordRef: Hashable, Sendable {
    var partition: InputPartition
    var offset: Int64
    /// Bumped each time the partition is assigned anew, so late completions of a previous
    /// assignment are not mistaken for current ones.
    var generation: Int
}

/// A record of an input topic and what decoding it gave.
struct IncomingRecord: Sendable {
    enum Payload: Sendable {
        case request(Result<PurchaseRequestEvent, EventValidationError>)
        case source(Result<EntitlementSourceEvent, EventValidationError>)
    }

    let message: KafkaMessage
    let payload: Payload

    init(message: KafkaMessage, isSource: Bool = false) {
        self.message = message
        self.payload = isSource ? .source(Self.decode(message.value)) : .request(Self.decode(message.value))
    }

    static func decode<Event: EncoreEvent>(_ value: [UInt8]) -> Result<Event, EventValidationError> {
        do throws(EventValidationError) {
            return .success(try Event(jsonBytes: value))
        } catch {
            return .failure(error)
        }
    }
}

/// Which worker owns a partition: partition number modulo the number of workers, the same for
/// the requests and the sources topic, so a user's records and ledger state stay on one worker.
struct WorkerRouter {
    let count: Int

    func worker(of partition: Int32) -> Int { Int(partition) % count }

    /// `items` by owning worker, in their order; workers with none are left out.
    func split<T>(_ items: [T], by partition: (T) -> Int32) -> [(worker: Int, items: [T])] {
        guard count > 1 else { return items.isEmpty ? [] : [(0, items)] }
        var parts = [[T]](repeating: [], count: count)
        for item in items { parts[worker(of: partition(item))].append(item) }
        return parts.enumerated().filter { !$0.element.isEmpty }.map { ($0.offset, $0.element) }
    }
}

/// A worker's view of the shared producer: its tokens carry the worker's number, so deliveries
/// find their way back to it.
struct WorkerProducer: OutputProducer {
    let producer: any OutputProducer
    let worker: Int
    let workers: Int

    func produce(_ record: KafkaProducerRecord, token: UInt) throws(KafkaError) {
        try producer.produce(record, token: token * UInt(workers) + UInt(worker))
    }

    /// Deliveries by worker, with the worker's own tokens.
    static func split(_ deliveries: [KafkaDelivery], workers: Int) -> [(worker: Int, items: [KafkaDelivery])] {
        guard workers > 1 else { return [(0, deliveries)] }
        var parts = [[KafkaDelivery]](repeating: [], count: workers)
        for var delivery in deliveries {
            let worker = Int(delivery.token % UInt(workers))
            delivery.token /= UInt(workers)
            parts[worker].append(delivery)
        }
        return parts.enumerated().filter { !$0.element.isEmpty }.map { ($0.offset, $0.element) }
    }
}

/// A revocation split among workers: the consumer's revocation is acknowledged, with every
/// worker's offsets, once each worker has handed over its share.
final class RevocationHandOver: Sendable {
    private let revocation: KafkaRevocation
    private let state: Mutex<(remaining: Int, offsets: [KafkaTopicPartitionOffset])>

    init(_ revocation: KafkaRevocation, parts: Int) {
        self.revocation = revocation
        state = Mutex((parts, []))
        if parts == 0 { revocation.acknowledge() }
    }

    func acknowledge(committing offsets: [KafkaTopicPartitionOffset]) {
        let all = state.withLock { state -> [KafkaTopicPartitionOffset]? in
            state.offsets += offsets
            state.remaining -= 1
            return state.remaining == 0 ? state.offsets : nil
        }
        if let all { revocation.acknowledge(committing: all) }
    }
}

/// An output waiting for the broker's answer: the input record it belongs to (`nil` for outputs
/// of no record, such as expiries) and what it is.
struct OutputSlot {
    var ref: RecordRef?
    var output: Output
}

/// An output as the loop hands it to the output queue, which encodes it off the loop.
enum UnsentOutput: Sendable {
    case outcome(PurchaseOutcomeEvent)
    case change(EntitlementChangeEvent)
    case state(EntitlementStateRecord, partition: Int32)
    case deadLetter(DeadLetterEvent, key: [UInt8]?)
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

/// A valid request waiting for, or in, its controller call: a class, since queues move it around
/// and the loop updates its call in place. Owned by the loop.
final class WorkItem {
    let ref: RecordRef
    let request: PurchaseRequestEvent
    let message: KafkaMessage
    /// One lane per user.
    let lane: UserLane
    /// The request id, for the duplicate window.
    let requestID: HashedString

    /// The routed controller, once the call started.
    var controllerName = ""
    var controller: (any PurchaseController)? = nil
    var attempt = 1
    var task: Task<Void, Never>? = nil
    var isBackingOff = false

    init(ref: RecordRef, request: PurchaseRequestEvent, message: KafkaMessage) {
        self.ref = ref
        self.request = request
        self.message = message
        self.lane = UserLane(appID: request.appID, appUserID: request.appUserID)
        self.requestID = HashedString(request.requestID)
    }
}

func currentTimeMs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}
