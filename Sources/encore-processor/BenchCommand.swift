import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka

/// `encore-processor bench`: one measured scenario, as a table or JSON.
enum BenchCommand {
    static let definition = CommandDefinition(
        name: "bench",
        summary: "Measure throughput, end-to-end latency, CPU and memory of one scenario.",
        usage: "bench [options]",
        options: CommonOptions.kafka + [
            .option(
                "count", value: "N", default: "100000",
                "Requests to process. On the embedded broker the default is 60000: it keeps about 10,000 requests a partition."
            ),
            .option("partitions", value: "N", default: "8", "Partitions of the topics."),
            .option("latency-ms", value: "MS", default: "0", "Mean latency of the simulated controller."),
            .option("max-in-flight", value: "N", default: "256", "Controller calls at once."),
            .option(
                "workers", value: "N",
                "Dispatch loops of the processor (partitions split among them). Default: as run's (the cores available)."
            ),
            .option(
                "buffer-size", value: "N", default: "\(ProcessorConfiguration.defaultBufferCapacity)",
                "Records held before the consumer stops reading."),
            .option("users", value: "N", default: "10000", "Distinct users."),
            .option(
                "dedupe-per-user", value: "N", default: "\(JournalPolicy().perUserCap)",
                "Most requests one user's journal holds, as with run (its journal records take this many slots)."),
            .option("rate", value: "R", default: "0", "Offered requests/s while processing; 0 = pre-filled backlog."),
            .option(
                "prefilled-topic", value: "TOPIC",
                "Consume this topic, already holding --count requests (e.g. from limit fill)."),
            .option("timeout-s", value: "S", default: "600", "Give up after this long."),
            .option(
                "state-dir", value: "DIR", default: "none",
                "Run with the local state store, as run does by default: a new one inside DIR, removed after the run; none: without it."
            ),
            .option(
                "state-cache-users", value: "N|all", default: "\(ProcessorConfiguration.defaultResidentUsers)",
                "With --state-dir: at most N users in memory, as with run (the others read from the store); all: every user."
            ),
            .flag(
                "no-ledger",
                "Run without the entitlement ledger (for brokers that cannot create the co-partitioned changelog)."),
            .option(
                "guarantee", value: "MODE", default: "at-least-once",
                "at-least-once or exactly-once (Kafka transactions, one producer per worker)."),
            .flag(
                "no-kafka",
                "Run one dispatch loop alone, without a broker (0 ms controller, ledger on): what the loop costs, with less noise. Takes --count, --users, --max-in-flight, --dedupe-per-user, --timeout-s."
            ),
            .flag("json", "Print the report as one JSON object."),
        ])

    /// What `--no-kafka` leaves out: refused rather than ignored.
    static let brokerOptions = [
        "bootstrap-servers", "X", "config", "print-config", "partitions", "latency-ms", "workers", "buffer-size",
        "rate", "prefilled-topic", "no-ledger", "guarantee",
    ]

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        if options.flag("no-kafka") { return try await loopOnly(options) }
        var benchmark = Benchmark.Options()
        benchmark.kafka = try CommonOptions.kafkaConfiguration(options)
        benchmark.bootstrapServers = benchmark.kafka.bootstrapServers
        benchmark.kafka.bootstrapServers = nil
        // The embedded broker deletes a partition's oldest records beyond about 5 MB: 100,000
        // requests in 8 partitions lose some before they are read.
        benchmark.count =
            benchmark.bootstrapServers == nil && !options.isSet("count")
            ? 60_000 : try options.integer("count", range: 1...100_000_000)
        benchmark.partitions = try options.integer("partitions", range: 1...10_000)
        benchmark.controllerLatency = try options.milliseconds("latency-ms")
        benchmark.maxInFlight = try options.integer("max-in-flight", range: 1...1_000_000)
        benchmark.bufferCapacity = try options.integer("buffer-size", range: 1...10_000_000)
        benchmark.users = try options.integer("users", range: 1...10_000_000)
        benchmark.journalPerUserCap = try options.integer(
            "dedupe-per-user", range: 1...EntitlementStateRecord.RequestEntry.maximumCount)
        benchmark.rate = try options.number("rate", range: 0...1e8)
        benchmark.prefilledTopic = options.string("prefilled-topic")
        benchmark.timeout = .seconds(try options.integer("timeout-s", range: 1...86_400))
        benchmark.ledger = !options.flag("no-ledger")
        // A store of its own inside the directory, removed after the run (never the directory given).
        var benchStore: String? = nil
        if let directory = options.string("state-dir"), directory != "none" {
            benchStore = (directory as NSString).appendingPathComponent("bench-\(UUID().uuidString)")
            benchmark.stateDirectory = benchStore
        }
        defer { if let benchStore { try? FileManager.default.removeItem(atPath: benchStore) } }
        if options.string("state-cache-users") == "all" {
            benchmark.residentUsers = nil
        } else {
            if benchStore == nil && options.isSet("state-cache-users") {
                throw UsageError("--state-cache-users needs --state-dir")
            }
            benchmark.residentUsers = try options.integer("state-cache-users", range: 1...1_000_000_000)
        }
        benchmark.guarantee = try CommonOptions.guarantee(options)
        benchmark.workers =
            options.isSet("workers")
            ? try options.integer("workers", range: 1...64)
            : RunCommand.defaultWorkers(maxInFlight: benchmark.maxInFlight)
        if benchmark.prefilledTopic != nil && benchmark.rate > 0 {
            throw UsageError("--prefilled-topic and --rate exclude each other")
        }
        let report = try await Benchmark.run(benchmark)
        if options.flag("json") {
            print(report.json)
        } else {
            for (label, value) in report.fields {
                print(label.padding(toLength: 24, withPad: " ", startingAt: 0) + value)
            }
        }
        return report.processed >= benchmark.count && report.allCommitted ? 0 : 1
    }

    static func loopOnly(_ options: ParsedOptions) async throws -> Int32 {
        if let option = brokerOptions.first(where: { options.isSet($0) }) {
            throw UsageError("--no-kafka runs no broker: \(options.spelling(option)) does not apply")
        }
        var benchmark = LoopBenchmark.Options()
        benchmark.count = try options.integer("count", range: 1...100_000_000)
        benchmark.users = try options.integer("users", range: 1...10_000_000)
        benchmark.maxInFlight = try options.integer("max-in-flight", range: 1...1_000_000)
        benchmark.journalPerUserCap = try options.integer(
            "dedupe-per-user", range: 1...EntitlementStateRecord.RequestEntry.maximumCount)
        benchmark.timeout = .seconds(try options.integer("timeout-s", range: 1...86_400))
        let report = await LoopBenchmark.run(benchmark)
        let fields: [(String, String)] = [
            ("scenario", "one dispatch loop, no broker, 0 ms controller, ledger on"),
            ("processed", "\(report.processed) (\(report.outcomes) outcomes)"),
            ("users", "\(benchmark.users)"), ("journal per user", "\(benchmark.journalPerUserCap)"),
            ("throughput", String(format: "%.0f/s", report.throughput)),
            ("cpu", String(format: "%.2f s, %.1f µs per request", report.cpuSeconds, report.cpuMicrosecondsPerRequest)),
            (
                "journal",
                String(
                    format: "%d requests remembered, %.1f bytes each", report.rememberedRequests,
                    report.journalBytesPerRequest)
            ),
            (
                "memory",
                String(
                    format: "%.1f MB resident, %.1f MB once %@ returned what it holds freed",
                    report.residentMegabytes, report.residentMegabytesAfterReturn, report.allocator)
            ),
        ]
        if options.flag("json") {
            let json: [String: Any] = [
                "scenario": "loop-only", "count": benchmark.count, "processed": report.processed,
                "outcomes": report.outcomes, "users": benchmark.users, "max_in_flight": benchmark.maxInFlight,
                "dedupe_per_user": benchmark.journalPerUserCap, "elapsed_s": report.elapsedSeconds,
                "throughput": report.throughput, "cpu_s": report.cpuSeconds,
                "cpu_us_per_request": report.cpuMicrosecondsPerRequest,
                "remembered_requests": report.rememberedRequests,
                "journal_bytes_per_request": report.journalBytesPerRequest,
                "rss_mb": report.residentMegabytes, "rss_after_memory_return_mb": report.residentMegabytesAfterReturn,
                "allocator": report.allocator,
            ]
            let data = try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            for (label, value) in fields { print(label.padding(toLength: 24, withPad: " ", startingAt: 0) + value) }
        }
        return report.processed == benchmark.count && report.outcomes == benchmark.count ? 0 : 1
    }
}
