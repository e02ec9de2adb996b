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
                case .error(let error):
                    for inbox in inboxes where error.isFatal { inbox.post(.consumerFailed(error)) }
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
        // A member may take the drain timeout to hand partitions over (its calls must return first);
        // the group's rebalance timeout is max.poll.interval.ms, so it must be longer (checked in validate()).
        consumerConfiguration.setDefault("max.poll.interval.ms", "\(configuration.minimumMaxPollIntervalMs)")
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
                configuration: consumerConfiguration, revocationReportInterval: configuration.drainTimeout,
                admission: admission, logger: Logger(label: "encore.consumer"))
            return (consumer, producer)
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}
