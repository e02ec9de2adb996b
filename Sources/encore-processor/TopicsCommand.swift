import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor topics create|list|describe|verify`: the topics on a real cluster.
enum TopicsCommand {
    static let definition = CommandDefinition(
        name: "topics",
        summary: "Create, list, describe or verify the processor's topics on a cluster.",
        usage: "topics (create | list | describe | verify) --bootstrap-servers HOST:PORT [options]",
        options: CommonOptions.kafka + CommonOptions.topics + [
            .option("partitions", value: "N", default: "8", "Partitions of each topic."),
            .option("replication-factor", value: "N", default: "1", "Replicas of each partition (3 in production)."),
            .option("retention-ms", value: "MS", default: "604800000", "Retention of outcomes and dead letters."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            create makes the topics (existing ones are left alone; the changelog compacted). list
            prints every topic of the cluster; describe the processor's topics with their
            partitions, replication and cleanup policy. verify exits 1 on a missing topic, a
            partition count that differs (from --partitions when given, else from the requests
            topic's), a changelog that is not compacted (or whose configuration the broker cannot
            describe), or replication below --replication-factor.
            """)

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        let action = try options.action(["create", "list", "describe", "verify"])
        // (Values first: a bad one is named even without brokers.)
        let partitions = try options.integer("partitions", range: 1...100_000)
        let replication = try options.integer("replication-factor", range: 1...100)
        let retention = try options.integer("retention-ms", range: -1...Int.max)
        let kafka = try CommonOptions.clusterConfiguration(options)
        let names = CommonOptions.topicNames(options)
        if options.endsAtCheck() { return 0 }
        let admin = try KafkaAdmin(configuration: kafka)
        switch action {
        case "list":
            for topic in try await admin.listTopics() {
                print("\(topic.name)  partitions=\(topic.partitions)  replication=\(topic.replicationFactor)")
            }
            return 0
        case "describe", "verify":
            return try await describe(
                names, stateTopic: options.string("state-topic")!, admin: admin, verify: action == "verify",
                partitions: options.isSet("partitions") ? partitions : nil, replication: replication)
        default:
            break
        }
        let stateTopic = options.string("state-topic")!
        let specifications = names.map { name in
            KafkaTopicSpecification(
                name: name, partitions: partitions, replicationFactor: replication,
                // The ledger's changelog keeps the latest state of every user, forever.
                configs: name == stateTopic ? ["cleanup.policy": "compact"] : ["retention.ms": String(retention)])
        }
        try await admin.createTopics(specifications)
        for name in names {
            let count = try await admin.partitionCount(of: name)
            print("\(name): \(count.map { "\($0) partitions" } ?? "missing")")
        }
        return 0
    }
}

extension TopicsCommand {
    /// Prints each topic's partitions, replication and cleanup policy; with `verify`, the
    /// problems too, and 1 when there is one.
    static func describe(
        _ names: [String], stateTopic: String, admin: KafkaAdmin, verify: Bool, partitions expected: Int?,
        replication: Int
    ) async throws -> Int32 {
        let topics = Dictionary(uniqueKeysWithValues: try await admin.listTopics().map { ($0.name, $0) })
        let wanted = expected ?? topics[names[0]]?.partitions
        var problems: [String] = []
        var describable = true
        for name in names {
            guard let topic = topics[name] else {
                print("\(name)  missing")
                problems.append("'\(name)' does not exist")
                continue
            }
            // (A broker that cannot describe configurations, the mock, is asked once, briefly.)
            let configuration = describable ? try await admin.topicConfiguration(name, timeout: .seconds(3)) : nil
            if configuration == nil { describable = false }
            let policy = configuration?["cleanup.policy"] ?? "?"
            print(
                "\(name)  partitions=\(topic.partitions)  replication=\(topic.replicationFactor)  cleanup.policy=\(policy)"
            )
            if let wanted, topic.partitions != wanted {
                problems.append("'\(name)' has \(topic.partitions) partitions, not \(wanted)")
            }
            if topic.replicationFactor < replication {
                problems.append("'\(name)' has \(topic.replicationFactor) replicas, fewer than \(replication)")
            }
            if name == stateTopic {
                if configuration == nil {
                    problems.append(
                        "'\(name)': the broker cannot describe its configuration, so compaction is unchecked")
                } else if !policy.contains("compact") {
                    problems.append(
                        "'\(name)' is the ledger's changelog but cleanup.policy is '\(policy)', not compact")
                }
            }
        }
        guard verify else { return 0 }
        for problem in problems { FileHandle.standardError.write(Data("verify: \(problem)\n".utf8)) }
        FileHandle.standardError.write(Data((problems.isEmpty ? "verify: OK\n" : "").utf8))
        return problems.isEmpty ? 0 : 1
    }
}

/// `encore-processor broker`: an embedded broker in a process of its own, for tests and laptops.
enum BrokerCommand {
    static let definition = CommandDefinition(
        name: "broker",
        summary: "Run librdkafka's mock cluster as a standalone broker until SIGTERM/SIGINT.",
        usage: "broker [options]",
        options: CommonOptions.topics + [
            .option("partitions", value: "N", default: "8", "Partitions of each topic."),
            .option("brokers", value: "N", default: "1", "Brokers in the cluster."),
            .option("log-level", value: "LEVEL", default: "warning", "debug, info, warning or error."),
        ],
        discussion: "Prints 'bootstrap.servers=HOST:PORT,...' on the first line of standard output.")

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        if let level = Logger.Level(name: options.string("log-level")!) { Logger.threshold = level }
        let cluster = try EmbeddedKafkaCluster(brokers: try options.integer("brokers", range: 1...9))
        let partitions = try options.integer("partitions", range: 1...10_000)
        for topic in CommonOptions.topicNames(options) { try cluster.createTopic(topic, partitions: partitions) }
        print("bootstrap.servers=\(cluster.bootstrapServers)")
        fflush(nil)
        let (stopped, stop) = AsyncStream<Void>.makeStream()
        let signals = SignalHandler { _ in stop.yield() }
        defer { signals.cancel() }
        for await _ in stopped { break }
        withExtendedLifetime(cluster) {}
        return 0
    }
}
