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
    let recorder = StatisticsRecorder()
    private let inputs: AsyncStream<ProcessorInput>
    private let input: AsyncStream<ProcessorInput>.Continuation
    private let hasRun = Atomic<Bool>(false)

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
        (inputs, input) = AsyncStream.makeStream()
    }

    /// A snapshot of the counters and latency histogram.
    public var statistics: ProcessorStatistics { recorder.snapshot }

    /// Asks ``run()`` to stop: no new work, running calls finish (within the drain timeout), their
    /// outputs are delivered and offsets committed, then `run()` returns. Safe from any thread.
    public func shutdown() {
        input.yield(.shutdown)
    }

    /// Processes until ``shutdown()`` is called (or the task is cancelled), then drains and returns.
    /// Throws when the processor cannot go on without losing data (an output that cannot be delivered).
    public func run() async throws(ProcessorError) {
        guard !hasRun.exchange(true, ordering: .acquiringAndReleasing) else {
            throw ProcessorError(.invalidConfiguration, "a processor runs once; create a new one")
        }
        let clients = try makeClients()
        do {
            try clients.consumer.subscribe(topics: [configuration.requestsTopic])
        } catch {
            throw ProcessorError(.kafka, "cannot subscribe to '\(configuration.requestsTopic)': \(error)")
        }
        logger.info(
            "processing \(configuration.requestsTopic) as group '\(configuration.groupID)' (max in flight \(configuration.maxInFlight))"
        )
        let input = self.input
        let forwarder = Task {
            for await event in clients.consumer.events { input.yield(.consumer(event)) }
            input.yield(.consumerEnded)
        }
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(20))
                input.yield(.tick)
            }
        }
        let cancellation = input
        let loop = ProcessorLoop(
            configuration: configuration, router: router, recorder: recorder, consumer: clients.consumer,
            producer: clients.producer, input: input, logger: logger)
        let failure: ProcessorError? = await withTaskCancellationHandler {
            for await event in inputs {
                loop.handle(event)
                if loop.isFinished { break }
            }
            return loop.failure
        } onCancel: {
            cancellation.yield(.shutdown)
        }
        ticker.cancel()
        loop.cancelRemainingCalls()
        do {
            try await clients.producer.flush(timeout: configuration.drainTimeout)
        } catch {
            logger.error("outputs still undelivered at shutdown: \(error)")
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

    private func makeClients() throws(ProcessorError) -> (consumer: KafkaConsumer, producer: KafkaProducer) {
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
        consumerConfiguration.setDefault("auto.commit.interval.ms", "1000")
        do {
            let producer = try KafkaProducer(
                configuration: producerConfiguration, logger: Logger(label: "encore.producer"))
            let consumer = try KafkaConsumer(
                configuration: consumerConfiguration, revocationTimeout: configuration.drainTimeout + .seconds(5),
                logger: Logger(label: "encore.consumer"))
            return (consumer, producer)
        } catch {
            throw ProcessorError(.invalidConfiguration, "-X: \(error.message)")
        }
    }
}

/// Everything that reaches the processor's loop, in one stream so one task owns all state.
enum ProcessorInput: Sendable {
    case consumer(KafkaConsumerEvent)
    case consumerEnded
    case attemptFinished(call: Int, attempt: Int, Result<PurchaseResult, any Error>)
    case delivered(RecordRef, Output, Result<KafkaDeliveryReport, KafkaError>, KafkaProducerRecord)
    case tick
    case shutdown
}

/// A record of the requests topic, within one assignment of its partition.
struct RecordRef: Hashable, Sendable {
    var partition: KafkaTopicPartition
    var offset: Int64
    /// Bumped each time the partition is assigned anew, so late completions of a previous
    /// assignment are not mistaken for current ones.
    var generation: Int
}

/// What a produced record was, for statistics.
enum Output: Sendable {
    case outcome(OutcomeResult, requestedAtMs: Int64)
    case deadLetter
}

/// A valid request waiting for, or in, its controller call.
struct WorkItem: Sendable {
    var ref: RecordRef
    var request: PurchaseRequestEvent
    var message: KafkaMessage
}

func currentTimeMs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}
