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
    let vitals = ProcessorVitals()

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
        // The changelog holds the request journal, with the ledger or without it.
        [configuration.outcomesTopic, configuration.deadLetterTopic, configuration.stateTopic]
            + (configuration.ledgerEnabled ? [configuration.entitlementsTopic] : [])
    }

    /// A snapshot of the counters and latency histogram.
    public var statistics: ProcessorStatistics { .combined(workers.map(\.recorder.snapshot)) }

    /// Asks ``run()`` to stop: no new work, running calls finish (within the drain timeout), their
    /// outputs are delivered and offsets committed, then `run()` returns. Safe from any thread.
    public func shutdown() {
        for worker in workers { worker.inbox.post(.shutdown) }
    }

    /// Processes until ``shutdown()`` is called (or the task is cancelled), then drains and returns.
    /// Throws when the processor cannot go on without losing data (an output that cannot be
    /// delivered), or ``ProcessorError/Code/callStuck`` when a controller call ignored cancellation
    /// for as long as the group allows: then the partitions were not handed over, and the caller
    /// must exit the process so that the call cannot run beside their next owner.
    public func run() async throws(ProcessorError) {
        guard !hasRun.exchange(true, ordering: .acquiringAndReleasing) else {
            throw ProcessorError(.invalidConfiguration, "a processor runs once; create a new one")
        }
        vitals.update {
            $0.startedAtMs = Int64(Date().timeIntervalSince1970 * 1000)
            $0.running = true
        }
        defer { vitals.update { $0.running = false } }
        try await checkTopics()
        let configuration = self.configuration
        let share = configuration.perWorker
        let workers = self.workers
        let inboxes = workers.map(\.inbox)
        // The consumer counts the records it hands out; the loops release them when done.
        let admission = KafkaAdmission(capacity: configuration.bufferCapacity)
        let store = try openStateStore()
        defer { store?.stop() }
        let clients = try makeClients(admission: admission, inboxes: inboxes, store: store)
        vitals.update {
            $0.admission = admission
            $0.consumer = clients.consumer
            $0.store = store
        }
        let committers = try await transactionCommitters(clients, store: store)
        // The first outputs would otherwise wait for their topics' metadata (a start-up stall).
        // Every producer at once: each topic may take its 5 s when the cluster is slow.
        let (logger, vitals, outputTopics) = (self.logger, self.vitals, self.outputTopics)
        await withTaskGroup(of: Void.self) { group in
            for producer in clients.producers {
                group.addTask {
                    for topic in outputTopics {
                        do {
                            try await producer.prepare(topic: topic, timeout: .seconds(5))
                        } catch {
                            logger.warning("cannot read the metadata of '\(topic)' yet: \(error)")
                        }
                    }
                }
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
        let forwarder = Task {
            await Self.forward(
                from: clients.consumer, to: inboxes, configuration: configuration, store: store, vitals: vitals,
                logger: logger)
        }
        let ticker = Task {
            var ticks = 0
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(20))
                for inbox in inboxes { inbox.post(.tick) }
                ticks += 1
                // Every 10 s: what the allocator holds freed goes back to the system (off the
                // cooperative pool: returning pages blocks).
                if ticks % 500 == 0 {
                    DispatchQueue.global(qos: .utility).async { ProcessResources.returnFreedMemory() }
                }
            }
        }
        let router = self.router
        let (failure, finalOffsets) = await withTaskGroup(
            of: (ProcessorError?, [KafkaTopicPartitionOffset]).self
        ) { group in
            for (index, worker) in workers.enumerated() {
                group.addTask {
                    // The loop lives and ends in this task: it owns its state alone.
                    let loop = WorkerExecutor(
                        configuration: share, router: router, recorder: worker.recorder, consumer: clients.consumer,
                        producer: clients.producer(of: index), inbox: worker.inbox, admission: admission,
                        logger: logger, committer: committers?[index], userSource: store)
                    await withTaskCancellationHandler {
                        await loop.run(beforeAbort: {
                            // The others stop now, not after this worker's abort (it may wait on the broker).
                            if loop.failure != nil { for inbox in inboxes { inbox.post(.shutdown) } }
                        })
                    } onCancel: {
                        worker.inbox.post(.shutdown)
                    }
                    return (loop.failure, loop.finalCommitOffsets)
                }
            }
            // A worker that cannot go on stops the others: they drain and commit what they did.
            var first: ProcessorError? = nil
            var offsets: [KafkaTopicPartitionOffset] = []
            for await (failure, finalOffsets) in group {
                offsets += finalOffsets
                if let failure, first == nil {
                    first = failure
                    vitals.update { $0.failure = failure.message }
                    for inbox in inboxes { inbox.post(.shutdown) }
                }
            }
            return (first, offsets)
        }
        ticker.cancel()
        // (The store closes when this returns: its last usage sample is not shown as current.)
        vitals.update { $0.store = nil }
        // All at once: each may take the drain timeout when the brokers are gone.
        await withTaskGroup(of: Void.self) { group in
            for producer in clients.producers {
                group.addTask {
                    do {
                        try await producer.flush(timeout: configuration.drainTimeout)
                    } catch {
                        logger.error("outputs still undelivered at shutdown: \(error)")
                    }
                }
            }
        }
        do {
            // Exactly-once: the last transactions held them.
            if !finalOffsets.isEmpty && committers == nil { try await clients.consumer.commit(finalOffsets) }
        } catch {
            logger.error("final offset commit failed: \(error)")
        }
        if failure?.code == .callStuck {
            // Closing would hand the partitions over while the call still runs: leave the group to
            // the process's exit, which ends the call too.
            logger.error("not leaving the group cleanly: exit the process now")
        } else {
            await clients.consumer.close()
        }
        forwarder.cancel()
        await forwarder.value
        await ticker.value
        await withTaskGroup(of: Void.self) { group in
            for producer in clients.producers { group.addTask { await producer.close(timeout: .seconds(5)) } }
        }
        let statistics = self.statistics
        logger.info(
            "stopped: \(statistics.received) received, \(statistics.outcomeCount) outcomes, \(statistics.deadLetters) dead letters, \(statistics.duplicates) duplicates"
        )
        if let failure { throw failure }
    }

    /// Exactly-once: registers each worker's transactional producer (fencing an earlier one with
    /// the same `transactional.id`) and begins its first transaction; one committer per worker.
    private func transactionCommitters(
        _ clients: Clients, store: StateStoreWriter?
    ) async throws(ProcessorError) -> [any TransactionCommitter]? {
        guard configuration.guarantee == .exactlyOnce else { return nil }
        var committers: [any TransactionCommitter] = []
        for (worker, producer) in clients.producers.enumerated() {
            do {
                try await producer.initTransactions()
                try producer.beginTransaction()
            } catch {
                throw ProcessorError(.kafka, "cannot start transactions (--guarantee exactly-once): \(error)")
            }
            committers.append(
                KafkaTransactionCommitter(
                    producer: producer, consumer: clients.consumer, abortTimeout: configuration.drainTimeout,
                    ended: { committed in store?.transactionEnded(worker: worker, committed: committed) }))
        }
        return committers
    }

    /// The member's consumer and producers: one producer shared by the workers (at-least-once), or
    /// one per worker (exactly-once: a worker's transactions hold its own partitions' outputs and
    /// offsets, committed without waiting for the other workers).
    struct Clients {
        let consumer: KafkaConsumer
        /// One per worker (``ownProducers``), or one for all.
        let producers: [KafkaProducer]
        let ownProducers: Bool
        let workers: Int

        /// Worker `index`'s producer; a shared one marks its tokens with the worker's number.
        func producer(of index: Int) -> any OutputProducer {
            ownProducers ? producers[index] : WorkerProducer(producer: producers[0], worker: index, workers: workers)
        }
    }

    /// The local state store under `--state-dir`, and what keeps it up with the changelog.
    private func openStateStore() throws(ProcessorError) -> StateStoreWriter? {
        guard let directory = configuration.stateDirectory else { return nil }
        let store = try StateStore(
            directory: directory, group: configuration.groupID, stateTopic: configuration.stateTopic,
            cacheBytes: configuration.stateCacheBytes, writeBufferBytes: 32 << 20,
            logger: Logger(label: "encore.state"))
        logger.info("state store: \(directory)")
        return StateStoreWriter(
            store: store, transactional: configuration.guarantee == .exactlyOnce,
            interval: configuration.commitInterval, grace: configuration.stateUnownedGrace,
            logger: Logger(label: "encore.state"))
    }

    private func makeClients(
        admission: KafkaAdmission, inboxes: [Inbox<ProcessorInput>], store: StateStoreWriter?
    ) throws(ProcessorError) -> Clients {
        let (consumerConfiguration, producerConfigurations) = configuration.clientConfigurations(
            workers: inboxes.count)
        if configuration.guarantee == .exactlyOnce {
            let id = configuration.transactionalIDBase
            logger.info("exactly-once: transactional.id \(id)\(inboxes.count == 1 ? "" : "-<worker>")")
        }
        let ownProducers = producerConfigurations.count == inboxes.count
        do {
            let producers = try producerConfigurations.enumerated().map { index, own throws(KafkaError) in
                try KafkaProducer(
                    configuration: own, logger: Logger(label: "encore.producer"),
                    keepingAcknowledged: store == nil ? nil : configuration.stateTopic,
                    onDeliveries: { deliveries in
                        // The store follows the changelog records this instance wrote.
                        store?.acknowledged(deliveries, worker: index)
                        if ownProducers {
                            inboxes[index].post(.delivered(deliveries))
                        } else {
                            // Each worker's outputs carry its number in the token (see WorkerProducer).
                            for (worker, part) in WorkerProducer.split(deliveries, workers: inboxes.count) {
                                inboxes[worker].post(.delivered(part))
                            }
                        }
                    })
            }
            let consumer = try KafkaConsumer(
                configuration: consumerConfiguration, revocationReportInterval: configuration.drainTimeout,
                admission: admission, logger: Logger(label: "encore.consumer"))
            return Clients(
                consumer: consumer, producers: producers, ownProducers: ownProducers, workers: inboxes.count)
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}

extension ProcessorConfiguration {
    /// librdkafka's prefetch queue when `-X` does not set it (`queued.max.messages.kbytes`: the
    /// consumer's one queue, all partitions; it also caps `fetch.max.bytes` unless that is set).
    /// Refilled within 10 ms (`refillsQuickly`, librdkafka 2.1 on), 2 MiB keep the loops fed
    /// (measured on Tansu, 1,000,000 backlog, 8 partitions: 144.6 MB peak against 160.6 with 4 MiB,
    /// same throughput), but never less than two of a partition's fetches
    /// (`max.partition.fetch.bytes`, 1 MiB by default): a queue of one fetch ran at a fiftieth of
    /// the rate. Older versions were measured slower with a small queue, so they keep a deeper one.
    static func prefetchKilobytes(partitionFetch: String?, refillsQuickly: Bool) -> Int {
        guard refillsQuickly else { return 16384 }
        let fetchBytes = partitionFetch.flatMap { Int($0) } ?? 1_048_576
        return max(2048, 2 * ((fetchBytes + 1023) / 1024))
    }

    /// The consumer's configuration and each producer's (one shared at-least-once, one per worker
    /// exactly-once): the processor's defaults under what `-X` set.
    func clientConfigurations(workers: Int) -> (consumer: KafkaConfiguration, producers: [KafkaConfiguration]) {
        var producerConfiguration = kafka
        producerConfiguration.setDefault("enable.idempotence", "true")
        producerConfiguration.setDefault("acks", "all")
        producerConfiguration.setDefault("linger.ms", "5")
        // Java clients' partitioner, so keys land where other producers put them.
        producerConfiguration.setDefault("partitioner", "murmur2_random")
        // The buffer capacity bounds what is queued; never refuse a record locally.
        producerConfiguration.setDefault("queue.buffering.max.messages", "1000000")
        var consumerConfiguration = kafka
        consumerConfiguration.groupID = groupID
        // The processor commits itself, with the finished offsets beyond the commit as metadata.
        consumerConfiguration.setDefault("enable.auto.commit", "false")
        // A member may take the drain timeout to hand partitions over (its calls must return first);
        // the group's rebalance timeout is max.poll.interval.ms, so it must be longer (checked in validate()).
        consumerConfiguration.setDefault("max.poll.interval.ms", "\(minimumMaxPollIntervalMs)")
        // Consumer lag per partition for /metrics.
        consumerConfiguration.setDefault("statistics.interval.ms", "5000")
        if sourcesTopic != nil {
            // Co-partitioned topics stay together only under the range assignor (checked in validate()).
            consumerConfiguration.setDefault("partition.assignment.strategy", "range")
        }
        // librdkafka's own prefetch (64 MiB by default) adds to the processor's buffer; from 2.1 on,
        // a full prefetch queue is refilled after `fetch.queue.backoff.ms` (1 s by default, an idle
        // second each time), within 10 ms here.
        let refillsQuickly = LibrdkafkaVersion.isAtLeast(2, 1)
        if refillsQuickly { consumerConfiguration.setDefault("fetch.queue.backoff.ms", "10") }
        // (`fetch.message.max.bytes` is librdkafka's own name for `max.partition.fetch.bytes`.)
        let partitionFetch =
            consumerConfiguration["max.partition.fetch.bytes"] ?? consumerConfiguration["fetch.message.max.bytes"]
        let prefetch = Self.prefetchKilobytes(partitionFetch: partitionFetch, refillsQuickly: refillsQuickly)
        consumerConfiguration.setDefault("queued.max.messages.kbytes", "\(prefetch)")
        // At-least-once: one producer for every worker (its batches are shared). Exactly-once: one
        // transactional producer per worker; a zombie is fenced through the group metadata sent
        // with the offsets. A stable id (from --instance-id, or -X transactional.id; each worker
        // adds its number when there are several) also aborts a crashed member's open
        // transactions at once instead of after transaction.timeout.ms (Tansu never times one out).
        var producerConfigurations = [producerConfiguration]
        if guarantee == .exactlyOnce {
            producerConfiguration.setDefault("transaction.timeout.ms", "10000")
            consumerConfiguration.setDefault("isolation.level", "read_committed")
            let id = transactionalIDBase
            producerConfigurations = (0..<workers).map { worker in
                var own = producerConfiguration
                own["transactional.id"] = workers == 1 ? id : "\(id)-\(worker)"
                return own
            }
        }
        return (consumerConfiguration, producerConfigurations)
    }

    /// Creates every client `run` would, without brokers, and destroys them: `--check` refuses what
    /// librdkafka would refuse at the start.
    public func validateClients() throws(ProcessorError) {
        let (consumer, producers) = clientConfigurations(workers: workers)
        do {
            try consumer.validateClient(.consumer)
            // (The workers' producers differ in their transactional.id only.)
            try producers.first?.validateClient(.producer)
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}
