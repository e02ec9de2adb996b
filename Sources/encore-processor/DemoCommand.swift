import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka

/// `encore-processor demo`: the whole pipeline on an embedded broker, with a summary.
enum DemoCommand {
    static let definition = CommandDefinition(
        name: "demo",
        summary: "Run the processor on an embedded broker with generated requests and print a summary.",
        usage: "demo [options]",
        options: [
            .option("count", value: "N", default: "5000", "Requests to generate."),
            .option("partitions", value: "N", default: "8", "Partitions of the requests topic."),
            .option("simulated-latency-ms", value: "MS", default: "5", "Mean latency of the simulated store."),
            .option("max-in-flight", value: "N", default: "256", "Controller calls running at once."),
            .option("users", value: "N", default: "500", "Distinct users."),
            .option("duplicate-ratio", value: "R", default: "0.02", "Share of duplicate requests."),
            .option("invalid-ratio", value: "R", default: "0.02", "Share of invalid records."),
            .option("seed", value: "N", default: "7", "Seed of generator and store."),
            .option("log-level", value: "LEVEL", default: "warning", "debug, info, warning or error."),
        ])

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        guard let level = Logger.Level(name: options.string("log-level")!) else {
            throw UsageError("--log-level: '\(options.string("log-level")!)' is not one of debug, info, warning, error")
        }
        Logger.threshold = level
        let count = try options.integer("count", range: 1...10_000_000)
        let partitions = try options.integer("partitions", range: 1...1000)
        var generatorOptions = RequestGenerator.Options()
        generatorOptions.users = try options.integer("users", range: 1...10_000_000)
        generatorOptions.duplicateRatio = try options.number("duplicate-ratio", range: 0...0.5)
        generatorOptions.invalidRatio = try options.number("invalid-ratio", range: 0...0.5)
        generatorOptions.seed = UInt64(try options.integer("seed", range: 0...Int.max))

        print("starting an embedded Kafka broker...")
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        var configuration = ProcessorConfiguration(
            kafka: KafkaConfiguration(["bootstrap.servers": cluster.bootstrapServers]))
        configuration.groupID = "encore-demo"
        configuration.maxInFlight = try options.integer("max-in-flight", range: 1...100_000)
        for topic in [
            configuration.requestsTopic, configuration.outcomesTopic, configuration.entitlementsTopic,
            configuration.deadLetterTopic, configuration.stateTopic,
        ] {
            try cluster.createTopic(topic, partitions: partitions)
        }

        print("generating \(count) purchase requests for \(generatorOptions.users) users...")
        let producer = try KafkaProducer(configuration: configuration.kafka)
        var generator = RequestGenerator(options: generatorOptions)
        let generated = try await LoadGenerator(producer: producer, topic: configuration.requestsTopic).run(
            generator: &generator, count: count, duration: nil)
        await producer.close()
        try await MissingRequests.check(
            configuration.requestsTopic, partitions: partitions, written: generated.sent, kafka: configuration.kafka,
            embedded: true, otherBroker: nil)

        var router = PurchaseRouter()
        router.register(
            "simulated",
            SimulatedController(
                meanLatency: try options.milliseconds("simulated-latency-ms"),
                weights: [
                    (.purchased, 0.8), (.cancelled, 0.12), (.pending, 0.05), (.retryableError, 0.02), (.error, 0.01),
                ],
                seed: generatorOptions.seed))
        router.route(.prefix("rc_"), to: "simulated")
        router.route(.prefix("sk_"), to: "simulated")
        router.route(.prefix("promo_"), to: "simulated")
        // com.app.* products have no route: they show up as not_attempted.
        configuration.retry = RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(20))
        let processor = try PurchaseProcessor(configuration: configuration, router: router)
        print("processing (the consumer group joins in about 3 s)...")
        let signals = SignalHandler { _ in processor.shutdown() }
        defer { signals.cancel() }
        let clock = ContinuousClock()
        async let running: Void = processor.run()
        let deadline = clock.now.advanced(by: .seconds(300))
        while processor.statistics.finished < generated.acknowledged && clock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        processor.shutdown()
        try await running
        let statistics = processor.statistics
        print(summary(statistics, generated: generated))
        withExtendedLifetime(cluster) {}
        return statistics.finished >= generated.acknowledged ? 0 : 1
    }

    static func summary(_ statistics: ProcessorStatistics, generated: LoadGenerator.Progress) -> String {
        func row(_ label: String, _ value: String) -> String {
            "  " + label.padding(toLength: 28, withPad: " ", startingAt: 0) + value
        }
        var lines = ["", "Summary", row("requests generated", "\(generated.acknowledged)")]
        lines.append(row("  of which duplicates", "\(generated.duplicates)"))
        lines.append(row("  of which invalid", "\(generated.invalid)"))
        lines.append("")
        for result in OutcomeResult.allCases {
            lines.append(row("outcome \(result.rawValue)", "\(statistics.outcomes[result] ?? 0)"))
        }
        lines.append(row("dead letters", "\(statistics.deadLetters) (\(statistics.invalid) invalid input)"))
        lines.append(row("duplicates skipped", "\(statistics.duplicates)"))
        lines.append(row("entitlement changes", "\(statistics.entitlementChanges)"))
        lines.append(row("controller calls", "\(statistics.controllerCalls) (peak \(statistics.peakInFlight) at once)"))
        lines.append(row("throughput", String(format: "%.0f requests/s", statistics.throughput)))
        lines.append(
            row(
                "latency p50 / p99 / max",
                String(
                    format: "%.1f / %.1f / %.1f ms", Double(statistics.latency.percentile(0.5)) / 1000,
                    Double(statistics.latency.percentile(0.99)) / 1000, Double(statistics.latency.max) / 1000)))
        lines.append("  (latency: request time to outcome acknowledged; all requests were queued before the start)")
        return lines.joined(separator: "\n")
    }
}
