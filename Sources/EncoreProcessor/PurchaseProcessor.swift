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
        let share = configuration.perWorker
        let workers = self.workers
        let failure = await withTaskGroup(of: ProcessorError?.self) { group in
            for (index, worker) in workers.enumerated() {
                group.addTask {
                    do throws(ProcessorError) {
                        try await self.run(worker, index: index, configuration: share)
                        return nil
                    } catch {
                        return error
                    }
                }
            }
            // One worker that cannot go on stops the others: they drain and commit what they did.
            var first: ProcessorError? = nil
            for await failure in group where failure != nil && first == nil {
                first = failure
                for worker in workers { worker.inbox.post(.shutdown) }
            }
            return first
        }
        let statistics = self.statistics
        logger.info(
            "stopped: \(statistics.received) received, \(statistics.outcomeCount) outcomes, \(statistics.deadLetters) dead letters, \(statistics.duplicates) duplicates"
        )
        if let failure { throw failure }
    }

    /// One worker: its consumer (a member of the group), producer, forwarder and dispatch loop.
    private func run(_ worker: Worker, index: Int, configuration: ProcessorConfiguration) async throws(ProcessorError) {
        let (inbox, recorder) = (worker.inbox, worker.recorder)
        // The consumer counts the records it hands out; the loop releases them when done.
        let admission = KafkaAdmission(capacity: configuration.bufferCapacity)
        let clients = try makeClients(configuration: configuration, admission: admission, inbox: inbox)
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
        if index == 0 {
            logger.info(
                "processing \(configuration.requestsTopic) as group '\(configuration.groupID)' (\(workers.count) workers, max in flight \(configuration.maxInFlight * workers.count))"
            )
        }
        let logger = self.logger
        let forwarder = Task {
            // Decoding happens here, beside the loop rather than on it.
            for await event in clients.consumer.events {
                switch event {
                case .messages(let messages):
                    inbox.post(
                        .records(
                            messages.map {
                                IncomingRecord(message: $0, isSource: $0.topic == configuration.sourcesTopic)
                            }))
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
                            inbox.post(.failed(error))
                            continue
                        }
                    }
                    inbox.post(.assigned(partitions, finished: finished, restored: restored))
                default:
                    inbox.post(.consumer(event))
                }
            }
            inbox.post(.consumerEnded)
        }
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(20))
                inbox.post(.tick)
            }
        }
        let loop = ProcessorLoop(
            configuration: configuration, router: router, recorder: recorder, consumer: clients.consumer,
            producer: clients.producer, inbox: inbox, admission: admission, logger: logger)
        let failure: ProcessorError? = await withTaskCancellationHandler {
            while !loop.isFinished { loop.handle(await inbox.next()) }
            return loop.failure
        } onCancel: {
            inbox.post(.shutdown)
        }
        ticker.cancel()
        loop.cancelRemainingCalls()
        await loop.waitForOutputs()
        do {
            try await clients.producer.flush(timeout: configuration.drainTimeout)
        } catch {
            logger.error("outputs still undelivered at shutdown: \(error)")
        }
        await loop.commitTask?.value
        let finalOffsets = loop.finalCommitOffsets
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
        configuration: ProcessorConfiguration, admission: KafkaAdmission, inbox: Inbox<ProcessorInput>
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
        // librdkafka's own prefetch (64 MiB by default) adds to the processor's buffer.
        consumerConfiguration.setDefault("queued.max.messages.kbytes", "16384")
        do {
            let producer = try KafkaProducer(
                configuration: producerConfiguration, logger: Logger(label: "encore.producer"),
                onDeliveries: { inbox.post(.delivered($0)) })
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
