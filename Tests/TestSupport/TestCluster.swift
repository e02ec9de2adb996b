import Kafka

/// A fresh embedded cluster (librdkafka's mock) with the given topics, and configurations pointing at it.
public struct TestCluster {
    public let cluster: EmbeddedKafkaCluster

    public init(brokers: Int = 1, topics: [String: Int]) throws {
        cluster = try EmbeddedKafkaCluster(brokers: brokers)
        for (topic, partitions) in topics { try cluster.createTopic(topic, partitions: partitions) }
    }

    public var producerConfiguration: KafkaConfiguration {
        KafkaConfiguration(["bootstrap.servers": cluster.bootstrapServers])
    }

    public func consumerConfiguration(group: String) -> KafkaConfiguration {
        KafkaConfiguration([
            "bootstrap.servers": cluster.bootstrapServers, "group.id": group,
            "auto.commit.interval.ms": "200", "session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
        ])
    }
}

extension TestCluster {
    public var bootstrapServers: String { cluster.bootstrapServers }
}
