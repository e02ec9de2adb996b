import EncoreProcessor
import Foundation
import Kafka

/// Options every command that talks to Kafka shares.
enum CommonOptions {
    static let kafka: [OptionDefinition] = [
        .option(
            "bootstrap-servers", value: "HOST:PORT,...", environment: "ENCORE_BOOTSTRAP_SERVERS",
            "Kafka brokers; without it an embedded broker is started in this process."),
        .option(
            "X", short: "X", value: "KEY=VALUE", repeatable: true,
            "Any librdkafka property (security.protocol, sasl.*, ssl.*...), applied to every client."),
        .option(
            "log-level", value: "LEVEL", default: "info", environment: "ENCORE_LOG_LEVEL",
            "debug, info, warning or error."),
        .option(
            "log-format", value: "FORMAT", default: "text",
            "text, or json: one object per line (ts, level, logger, msg and fields such as request_id)."),
        .option(
            "config", value: "FILE",
            "Properties file: encore.<option>=VALUE sets an option, any other key is a librdkafka property (flag > env > file > default)."
        ),
        .flag("print-config", "Print the effective configuration (secrets redacted) and exit.", commandLineOnly: true),
    ]

    static let topics: [OptionDefinition] = [
        .option("requests-topic", value: "TOPIC", default: "encore.purchase-requests", "Topic of purchase requests."),
        .option("outcomes-topic", value: "TOPIC", default: "encore.purchase-outcomes", "Topic of purchase outcomes."),
        .option(
            "entitlements-topic", value: "TOPIC", default: "encore.entitlement-changes", "Topic of entitlement changes."
        ),
        .option("dead-letter-topic", value: "TOPIC", default: "encore.dead-letters", "Topic of dead letters."),
        .option(
            "state-topic", value: "TOPIC", default: "encore.entitlement-state",
            "Compacted changelog of the entitlement ledger (co-partitioned with the requests)."),
        .option(
            "sources-topic", value: "TOPIC",
            "Topic of subscription states reported by other sources (RevenueCat, Superwall...); off by default."),
    ]

    static let partitions = OptionDefinition.option(
        "partitions", value: "N", default: "8", "Partitions per topic when this command creates the topics.")

    /// The partitions of `topic`, asked without creating it; `nil` (with a message naming it on
    /// standard error) when it does not exist.
    static func partitionCount(of topic: String, described: String, kafka: KafkaConfiguration) async throws -> Int? {
        var adminConfiguration = kafka
        adminConfiguration["allow.auto.create.topics"] = "false"
        let count = try await KafkaAdmin(configuration: adminConfiguration).partitionCount(of: topic)
        if count == nil { FileHandle.standardError.write(Data("the \(described) '\(topic)' does not exist\n".utf8)) }
        return count
    }

    /// `--guarantee`: at-least-once or exactly-once.
    static func guarantee(_ options: ParsedOptions) throws(UsageError) -> DeliveryGuarantee {
        // (`choice` admits only the raw values.)
        DeliveryGuarantee(rawValue: try options.choice("guarantee", DeliveryGuarantee.allCases.map(\.rawValue)))!
    }

    /// ``kafkaConfiguration(_:)`` for a command that needs a running cluster: brokers are required.
    static func clusterConfiguration(_ options: ParsedOptions) throws(UsageError) -> KafkaConfiguration {
        let configuration = try kafkaConfiguration(options)
        guard configuration.bootstrapServers != nil else {
            throw UsageError("--bootstrap-servers (or ENCORE_BOOTSTRAP_SERVERS) is required")
        }
        return configuration
    }

    /// Applies `--log-level` and builds the Kafka configuration from `--bootstrap-servers` and `-X`.
    static func kafkaConfiguration(_ options: ParsedOptions) throws(UsageError) -> KafkaConfiguration {
        if let level = options.string("log-level") {
            guard let parsed = Logger.Level(name: level) else {
                throw UsageError("--log-level: '\(level)' is not one of debug, info, warning, error")
            }
            Logger.threshold = parsed
        }
        switch options.string("log-format") {
        case "json"?: Logger.format = .json
        case "text"?, nil: Logger.format = .text
        case let other?: throw UsageError("--log-format: '\(other)' is not text or json")
        }
        var configuration = KafkaConfiguration()
        for assignment in options.strings("X") {
            let (key, value): (String, String)
            do {
                (key, value) = try KafkaConfiguration.parseAssignment(assignment)
            } catch {
                throw UsageError("-X: \(error.message)")
            }
            configuration[key] = try secret(value, origin: "-X \(key)")
        }
        do {
            try configuration.validate()
        } catch {
            throw UsageError("-X: \(error.message)")
        }
        if let servers = options.string("bootstrap-servers") { configuration.bootstrapServers = servers }
        return configuration
    }

    /// A value, or with `@/path` the contents of that file (a secret mounted by the platform),
    /// without a trailing newline; `@@...` is a value starting with `@`.
    static func secret(_ value: String, origin: String) throws(UsageError) -> String {
        guard value.hasPrefix("@") else { return value }
        if value.hasPrefix("@@") { return String(value.dropFirst()) }
        let path = String(value.dropFirst())
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8)
        else { throw UsageError("\(origin): cannot read the secret file '\(path)'") }
        return text.hasSuffix("\r\n") ? String(text.dropLast(2)) : text.hasSuffix("\n") ? String(text.dropLast()) : text
    }

    /// RFC 3339 (`2026-11-30T10:00:00Z`, fractions allowed) or epoch milliseconds.
    static func time(_ text: String, option: String) throws(UsageError) -> Int64 {
        if let ms = Int64(text), ms >= 0 { return ms }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let plain = ISO8601DateFormatter()
        guard let date = formatter.date(from: text) ?? plain.date(from: text) else {
            throw UsageError("--\(option): '\(text)' is neither RFC 3339 (2026-11-30T10:00:00Z) nor epoch milliseconds")
        }
        return Int64((date.timeIntervalSince1970 * 1000).rounded())
    }

    /// Requests, outcomes, entitlements, dead-letter and state topics, then the sources topic if given.
    static func topicNames(_ options: ParsedOptions) -> [String] {
        ["requests-topic", "outcomes-topic", "entitlements-topic", "dead-letter-topic", "state-topic"].map {
            options.string($0)!
        } + (options.string("sources-topic").map { [$0] } ?? [])
    }

    /// Starts an embedded broker with `topics` when no bootstrap servers are configured.
    static func embeddedBrokerIfNeeded(
        _ configuration: inout KafkaConfiguration, topics: [String], partitions: Int
    ) throws -> EmbeddedKafkaCluster? {
        guard configuration.bootstrapServers == nil else { return nil }
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        for topic in topics { try cluster.createTopic(topic, partitions: partitions) }
        configuration.bootstrapServers = cluster.bootstrapServers
        Logger(label: "encore").info("embedded broker listening on \(cluster.bootstrapServers)")
        return cluster
    }
}

/// Calls `onSignal` on the first SIGTERM or SIGINT; a second one exits at once.
final class SignalHandler {
    private let sources: [any DispatchSourceSignal]

    init(onSignal: @escaping @Sendable (Int32) -> Void) {
        let received = SignalCount()
        sources = [SIGTERM, SIGINT].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                if received.increment() > 1 {
                    FileHandle.standardError.write(Data("second signal: exiting at once\n".utf8))
                    // (_exit: no static destructors, which would run under the state store's
                    // RocksDB threads, still open.)
                    _exit(130)
                }
                onSignal(number)
            }
            source.resume()
            return source
        }
    }

    func cancel() {
        for source in sources { source.cancel() }
    }
}

import Synchronization

private final class SignalCount: Sendable {
    private let count = Atomic<Int>(0)
    func increment() -> Int { count.add(1, ordering: .relaxed).newValue }
}
