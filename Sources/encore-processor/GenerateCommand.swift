import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka

/// `encore-processor generate`: realistic purchase requests for load tests.
enum GenerateCommand {
    static let generatorOptions: [OptionDefinition] = [
        .option("users", value: "N", default: "1000", "Distinct users."),
        .option("skew", value: "S", default: "0", "Zipf exponent of the choice of user (0 = uniform, 1 = typical)."),
        .option(
            "products", value: "ID=W,...",
            default: "rc_pro_monthly=40,rc_pro_yearly=20,sk_lifetime=15,promo_winback_50=15,com.app.credits_100=10",
            "Product ids with weights."),
        .option("duplicate-ratio", value: "R", default: "0", "Share of records repeating an earlier request id."),
        .option("invalid-ratio", value: "R", default: "0", "Share of invalid records, of every invalid kind."),
        .option("app-id", value: "ID", default: "app_demo", "app_id of the generated requests."),
        .option(
            "environment", value: "ENV", default: "sandbox",
            "sandbox, production, or mixed (one in ten SANDBOX) for the requests' environment."),
    ]

    static let definition = CommandDefinition(
        name: "generate",
        summary: "Produce generated purchase requests to the requests topic.",
        usage: "generate (--count N | --duration SECONDS) [options]",
        options: CommonOptions.kafka + generatorOptions + [
            .option("count", value: "N", "Records to produce."),
            .option("duration", value: "SECONDS", "Produce for this long instead of a count."),
            .option("rate", value: "R", default: "0", "Records per second, steady; 0 = as fast as possible."),
            .option("topic", value: "TOPIC", default: "encore.purchase-requests", "Topic to produce to."),
            .option("seed", value: "N", default: "1", "Seed: the same seed gives the same records."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ])

    static func generatorOptions(_ options: ParsedOptions) throws(UsageError) -> RequestGenerator.Options {
        var generator = RequestGenerator.Options()
        generator.users = try options.integer("users", range: 1...10_000_000)
        generator.skew = try options.number("skew", range: 0...10)
        generator.duplicateRatio = try options.number("duplicate-ratio", range: 0...1)
        generator.invalidRatio = try options.number("invalid-ratio", range: 0...1)
        guard generator.duplicateRatio + generator.invalidRatio <= 1 else {
            throw UsageError("--duplicate-ratio and --invalid-ratio add up to more than 1")
        }
        generator.seed = UInt64(try options.integer("seed", range: 0...Int.max))
        generator.appID = options.string("app-id")!
        switch try options.choice("environment", ["sandbox", "production", "mixed"]) {
        case "production": generator.environment = .production
        case "mixed": generator.environment = nil
        default: generator.environment = .sandbox
        }
        var products: [RequestGenerator.Product] = []
        for part in options.string("products")!.split(separator: ",") {
            let pieces = part.split(separator: "=", maxSplits: 1)
            guard pieces.count == 2, !pieces[0].isEmpty, let weight = Double(pieces[1]), weight > 0 else {
                throw UsageError("--products: '\(part)' is not ID=WEIGHT with a positive weight")
            }
            products.append(.init(id: String(pieces[0]), weight: weight))
        }
        guard !products.isEmpty else { throw UsageError("--products: no product given") }
        generator.products = products
        return generator
    }

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        var kafka = try CommonOptions.kafkaConfiguration(options)
        let generatorOptions = try generatorOptions(options)
        let count = options.isSet("count") ? try options.integer("count", range: 0...Int.max) : nil
        let duration = options.isSet("duration") ? try options.number("duration", range: 0...1e7) : nil
        guard (count == nil) != (duration == nil) else {
            throw UsageError("give exactly one of --count and --duration")
        }
        let rate = try options.number("rate", range: 0...1e9)
        let topic = options.string("topic")!
        if options.endsAtCheck() { return 0 }
        let cluster = try CommonOptions.embeddedBrokerIfNeeded(&kafka, topics: [topic], partitions: 8)
        let producer = try KafkaProducer(configuration: kafka)
        var generator = RequestGenerator(options: generatorOptions)
        let isTerminal = isatty(STDERR_FILENO) == 1
        let progress = try await LoadGenerator(producer: producer, topic: topic, rate: rate).run(
            generator: &generator, count: count, duration: duration.map { .milliseconds(Int($0 * 1000)) }
        ) { progress in
            let line = String(
                format: "sent %d  acked %d  errors %d  %.0f/s", progress.sent, progress.acknowledged, progress.errors,
                progress.rate)
            FileHandle.standardError.write(Data((isTerminal ? "\r\u{1B}[K" + line : line + "\n").utf8))
        }
        if isTerminal { FileHandle.standardError.write(Data("\n".utf8)) }
        await producer.close()
        print(
            "generated \(progress.sent) records to \(topic): \(progress.acknowledged) acknowledged, \(progress.errors) errors, \(progress.duplicates) duplicates, \(progress.invalid) invalid, \(String(format: "%.0f", progress.rate))/s"
        )
        withExtendedLifetime(cluster) {}
        return progress.errors == 0 ? 0 : 1
    }
}
