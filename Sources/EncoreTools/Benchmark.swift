import EncoreEvents
import EncoreProcessor
import Foundation
import Synchronization
import Kafka

/// A measured scenario: pre-fill (or a steady offered rate), then the processor with the simulated
/// controller until every outcome is delivered and every offset committed.
public enum Benchmark {
    public struct Options: Sendable {
        /// `nil` starts the embedded broker in this process.
        public var bootstrapServers: String? = nil
        public var kafka = KafkaConfiguration()
        public var count = 100_000
        public var partitions = 8
        public var controllerLatency: Duration = .zero
        public var maxInFlight = 256
        public var workers = 1
        public var bufferCapacity = ProcessorConfiguration.defaultBufferCapacity
        public var users = 10_000
        /// Most requests one user's journal holds (`--dedupe-per-user`).
        public var journalPerUserCap = JournalPolicy().perUserCap
        /// Offered load in requests/s while processing; 0 pre-fills everything before the clock starts.
        public var rate = 0.0
        /// The requests topic already holds `count` requests (e.g. written by `limit fill`).
        public var prefilledTopic: String? = nil
        public var timeout: Duration = .seconds(600)
        /// The entitlement ledger runs (change events and changelog writes are part of the work).
        public var ledger = true
        /// The local state store's directory (`nil`: none).
        public var stateDirectory: String? = nil
        /// With a store: at most this many users in memory (`run --state-cache-users`).
        public var residentUsers: Int? = ProcessorConfiguration.defaultResidentUsers
        public var guarantee = DeliveryGuarantee.atLeastOnce
        public init() {}
    }

    public struct Report: Sendable {
        public var broker: String
        public var librdkafka: String
        public var count: Int
        public var partitions: Int
        public var controllerLatencyMs: Double
        public var maxInFlight: Int
        public var workers: Int
        public var users: Int
        /// Most requests one user's journal holds.
        public var journalPerUserCap: Int
        public var offeredRate: Double
        public var processed: Int
        public var elapsedSeconds: Double
        public var throughput: Double
        /// End-to-end latency (request time → outcome acknowledged), milliseconds.
        public var latencyMs: [String: Double]
        public var cpuSeconds: Double
        /// Process CPU from the first record received to the last finished, per request processed:
        /// the join and the start-up are left out.
        public var cpuMicrosecondsPerRequest: Double
        public var peakRSSMegabytes: Double
        public var allCommitted: Bool
        public var joinSeconds: Double
        public var ledger: Bool
        public var entitlementChanges: Int
        /// The mean time of a request in each stage, milliseconds (``RequestStages``).
        public var stagesMs: [(name: String, milliseconds: Double)]
        /// Records the processor held at most (`--buffer-size`).
        public var bufferSize: Int

        public var fields: [(String, String)] {
            [
                ("broker", broker), ("librdkafka", librdkafka), ("requests", "\(count)"),
                ("partitions", "\(partitions)"), ("controller latency", "\(controllerLatencyMs) ms"),
                ("max in flight", "\(maxInFlight)"), ("workers", "\(workers)"), ("users", "\(users)"),
                ("journal per user", "\(journalPerUserCap)"),
                ("offered rate", offeredRate > 0 ? String(format: "%.0f/s", offeredRate) : "backlog"),
                ("processed", "\(processed)"), ("elapsed", String(format: "%.3f s", elapsedSeconds)),
                ("throughput", String(format: "%.0f requests/s", throughput)),
                ("latency p50", String(format: "%.1f ms", latencyMs["p50"] ?? 0)),
                ("latency p90", String(format: "%.1f ms", latencyMs["p90"] ?? 0)),
                ("latency p99", String(format: "%.1f ms", latencyMs["p99"] ?? 0)),
                ("latency p99.9", String(format: "%.1f ms", latencyMs["p99.9"] ?? 0)),
                ("latency max", String(format: "%.1f ms", latencyMs["max"] ?? 0)),
                ("CPU", String(format: "%.2f s", cpuSeconds)),
                ("CPU per request", String(format: "%.1f µs", cpuMicrosecondsPerRequest)),
                ("peak RSS", String(format: "%.1f MB", peakRSSMegabytes)),
                ("all offsets committed", allCommitted ? "yes" : "NO"),
                ("group join", String(format: "%.1f s", joinSeconds)),
                ("entitlement ledger", ledger ? "on (\(entitlementChanges) changes)" : "off"),
                (
                    "time held, mean",
                    stagesMs.isEmpty
                        ? "-"
                        : stagesMs.map {
                            String(
                                format: "%@ %.1f ms", $0.name.replacingOccurrences(of: "_", with: " "), $0.milliseconds)
                        }
                        .joined(separator: ", ")
                ),
            ]
        }

        public var json: String {
            let object: [String: Any] = [
                "broker": broker, "librdkafka": librdkafka, "count": count, "partitions": partitions,
                "controller_latency_ms": controllerLatencyMs, "max_in_flight": maxInFlight, "workers": workers,
                "users": users, "dedupe_per_user": journalPerUserCap,
                "offered_rate": offeredRate, "processed": processed, "elapsed_s": elapsedSeconds,
                "throughput": throughput, "latency_ms": latencyMs, "cpu_s": cpuSeconds,
                "cpu_us_per_request": cpuMicrosecondsPerRequest,
                "peak_rss_mb": peakRSSMegabytes, "all_committed": allCommitted, "join_s": joinSeconds,
                "ledger": ledger, "entitlement_changes": entitlementChanges,
                "stages_ms": Dictionary(stagesMs.map { ($0.name, $0.milliseconds) }, uniquingKeysWith: { $1 }),
                "buffer_size": bufferSize,
            ]
            let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            return String(decoding: data, as: UTF8.self)
        }
    }

    public static func run(_ options: Options, logger: Logger = Logger(label: "encore.bench")) async throws -> Report {
        var kafka = options.kafka
        var cluster: EmbeddedKafkaCluster? = nil
        let suffix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        let requests = options.prefilledTopic ?? "bench-\(suffix).requests"
        let outputs = ["outcomes", "entitlements", "dead-letters", "state"].map { "bench-\(suffix).\($0)" }
        if let servers = options.bootstrapServers {
            kafka.bootstrapServers = servers
            let created = (options.prefilledTopic == nil ? [requests] : []) + outputs
            try await KafkaAdmin.create(
                created.map {
                    KafkaTopicSpecification(
                        name: $0, partitions: options.partitions,
                        configs: $0 == outputs[3] ? ["cleanup.policy": "compact"] : [:])
                }, kafka: kafka, logger: logger)
        } else {
            let embedded = try EmbeddedKafkaCluster()
            for topic in [requests] + outputs { try embedded.createTopic(topic, partitions: options.partitions) }
            kafka.bootstrapServers = embedded.bootstrapServers
            cluster = embedded
        }
        var generatorOptions = RequestGenerator.Options()
        generatorOptions.users = options.users
        generatorOptions.appID = "app_bench"
        if options.prefilledTopic == nil && options.rate == 0 {
            logger.info("pre-filling \(options.count) requests")
            let producer = try KafkaProducer(configuration: kafka)
            var generator = RequestGenerator(options: generatorOptions)
            let filled = try await LoadGenerator(producer: producer, topic: requests).run(
                generator: &generator, count: options.count, duration: nil)
            await producer.close()
            // A backlog not all there would leave the run waiting out its timeout for outcomes
            // that cannot come. (Offered load is not checked: there the broker also deletes
            // records the processor already read.)
            try await MissingRequests.check(
                requests, partitions: options.partitions, written: filled.sent, kafka: kafka,
                embedded: options.bootstrapServers == nil, otherBroker: "--bootstrap-servers")
        }

        var configuration = ProcessorConfiguration(kafka: kafka)
        configuration.groupID = "bench-\(suffix)"
        configuration.requestsTopic = requests
        configuration.outcomesTopic = outputs[0]
        configuration.entitlementsTopic = outputs[1]
        configuration.deadLetterTopic = outputs[2]
        configuration.stateTopic = outputs[3]
        configuration.ledgerEnabled = options.ledger
        configuration.stateDirectory = options.stateDirectory
        configuration.residentUsers = options.residentUsers
        configuration.guarantee = options.guarantee
        configuration.maxInFlight = options.maxInFlight
        configuration.workers = options.workers
        configuration.bufferCapacity = options.bufferCapacity
        configuration.journal.perUserCap = options.journalPerUserCap
        // The mock cluster and Tansu hold a fetch for its whole wait instead of answering when
        // data arrives; a short wait keeps that out of the latency figures.
        configuration.kafka.setDefault("fetch.wait.max.ms", "10")
        var router = PurchaseRouter()
        router.register(
            "simulated",
            SimulatedController(
                meanLatency: options.controllerLatency, weights: [(.purchased, 1)], seed: 1,
                // limit.c fills PRODUCTION-shaped requests; the benchmark's topics are its own.
                allowsProduction: true))
        router.route(.any, to: "simulated")
        let processor = try PurchaseProcessor(configuration: configuration, router: router)
        let started = Date()
        let cpuBefore = cpuSeconds()
        let ended = RunEnded()
        let running = Task {
            defer { ended.set() }
            try await processor.run()
        }
        if options.rate > 0 {
            // Offer load only once the group is joined, so the join does not count as latency.
            let joinDeadline = ContinuousClock.now.advanced(by: .seconds(120))
            while processor.statistics.assignedPartitions == 0 && ContinuousClock.now < joinDeadline && !ended.isSet {
                try await Task.sleep(for: .milliseconds(10))
            }
            // Warm-up: the first fetches of a fresh assignment (offset lookups) are not steady state.
            try await Task.sleep(for: .seconds(2))
        }
        let generating: Task<Void, any Error>? =
            options.rate > 0
            ? Task { [kafka, generatorOptions] in
                let producer = try KafkaProducer(configuration: kafka)
                var generator = RequestGenerator(options: generatorOptions)
                _ = try await LoadGenerator(producer: producer, topic: requests, rate: options.rate).run(
                    generator: &generator, count: options.count, duration: nil)
                await producer.close()
            } : nil
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: options.timeout)
        // A processor that stops on its own (a topic check failed) ends the run with its error.
        // The CPU of the processing window starts at the first record received (sampled every 10 ms).
        var cpuAtFirstRecord: (cpu: Double, finished: Int)? = nil
        while processor.statistics.finished < options.count && clock.now < deadline && !ended.isSet {
            try await Task.sleep(for: .milliseconds(10))
            if cpuAtFirstRecord == nil, processor.statistics.received > 0 {
                cpuAtFirstRecord = (cpuSeconds(), processor.statistics.finished)
            }
        }
        let statistics = processor.statistics
        let cpuNow = cpuSeconds()
        let cpu = cpuNow - cpuBefore
        let window = cpuAtFirstRecord ?? (cpuBefore, 0)
        let cpuPerRequest = (cpuNow - window.cpu) / Double(max(1, statistics.finished - window.finished)) * 1e6
        // Load for a processor that stopped on its own has nowhere to go.
        if ended.isSet { generating?.cancel() }
        processor.shutdown()
        try await running.value
        try await generating?.value
        let committed = try await committedTotal(
            kafka: kafka, group: configuration.groupID, topic: requests,
            partitions: options.partitions)
        let latency = statistics.latency
        let first = statistics.firstReceivedAtMs ?? 0
        let elapsed = Double((statistics.lastFinishedAtMs ?? first) - first) / 1000
        withExtendedLifetime(cluster) {}
        return Report(
            broker: options.bootstrapServers ?? "embedded", librdkafka: LibrdkafkaVersion.string, count: options.count,
            partitions: options.partitions,
            controllerLatencyMs: Double(options.controllerLatency.components.attoseconds) / 1e15
                + Double(options.controllerLatency.components.seconds) * 1000,
            maxInFlight: options.maxInFlight, workers: options.workers, users: options.users,
            journalPerUserCap: options.journalPerUserCap, offeredRate: options.rate,
            processed: statistics.finished, elapsedSeconds: elapsed, throughput: statistics.throughput,
            latencyMs: [
                "p50": Double(latency.percentile(0.5)) / 1000, "p90": Double(latency.percentile(0.9)) / 1000,
                "p99": Double(latency.percentile(0.99)) / 1000, "p99.9": Double(latency.percentile(0.999)) / 1000,
                "max": Double(latency.max) / 1000,
            ],
            cpuSeconds: cpu, cpuMicrosecondsPerRequest: cpuPerRequest, peakRSSMegabytes: peakRSSMegabytes(),
            allCommitted: committed == Int64(options.count),
            joinSeconds: Double(first) / 1000 - started.timeIntervalSince1970, ledger: options.ledger,
            entitlementChanges: statistics.entitlementChanges, stagesMs: statistics.stages.meanMilliseconds,
            bufferSize: options.bufferCapacity)
    }

    private static func committedTotal(
        kafka: KafkaConfiguration, group: String, topic: String, partitions: Int
    ) async throws -> Int64 {
        var configuration = kafka
        configuration.groupID = group
        let consumer = try KafkaConsumer(configuration: configuration)
        let committed = try await consumer.committed(
            (0..<Int32(partitions)).map { KafkaTopicPartition(topic: topic, partition: $0) })
        await consumer.close()
        return committed.map { max($0.offset, 0) }.reduce(0, +)
    }
}

/// Set once the processor's `run()` returned.
private final class RunEnded: Sendable {
    private let flag = Mutex(false)
    var isSet: Bool { flag.withLock { $0 } }
    func set() { flag.withLock { $0 = true } }
}

/// User plus system CPU seconds of this process.
public func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec)
        + Double(usage.ru_stime.tv_usec) / 1e6
}

/// The peak resident set size of this process, in megabytes.
public func peakRSSMegabytes() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_maxrss) / 1024
}
