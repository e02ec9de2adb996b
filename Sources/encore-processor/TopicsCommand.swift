import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor topics create`: the topics on a real cluster.
enum TopicsCommand {
    static let definition = CommandDefinition(
        name: "topics",
        summary: "Create the processor's topics on a cluster (existing topics are left alone).",
        usage: "topics create --bootstrap-servers HOST:PORT [options]",
        options: CommonOptions.kafka + CommonOptions.topics + [
            .option("partitions", value: "N", default: "8", "Partitions of each topic."),
            .option("replication-factor", value: "N", default: "1", "Replicas of each partition (3 in production)."),
            .option("retention-ms", value: "MS", default: "604800000", "Retention of outcomes and dead letters."),
            .flag("check", "Validate the arguments and exit."),
        ])

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        _ = try options.action(["create"])
        // (Values first: a bad one is named even without brokers.)
        let partitions = try options.integer("partitions", range: 1...100_000)
        let replication = try options.integer("replication-factor", range: 1...100)
        let retention = try options.integer("retention-ms", range: -1...Int.max)
        let kafka = try CommonOptions.clusterConfiguration(options)
        let names = CommonOptions.topicNames(options)
        if options.flag("check") {
            print("configuration OK")
            return 0
        }
        let stateTopic = options.string("state-topic")!
        let specifications = names.map { name in
            KafkaTopicSpecification(
                name: name, partitions: partitions, replicationFactor: replication,
                // The ledger's changelog keeps the latest state of every user, forever.
                configs: name == stateTopic ? ["cleanup.policy": "compact"] : ["retention.ms": String(retention)])
        }
        let admin = try KafkaAdmin(configuration: kafka)
        try await admin.createTopics(specifications)
        for name in names {
            let count = try await admin.partitionCount(of: name)
            print("\(name): \(count.map { "\($0) partitions" } ?? "missing")")
        }
        return 0
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
