import Foundation
import Kafka
import Synchronization

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
func eventually(
    timeout: Duration = .seconds(30), _ condition: @Sendable () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: timeout)
    while clock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}

/// Reads a consumer's events on a task of its own and records them, acknowledging revocations.
final class ConsumerProbe: Sendable {
    let consumer: KafkaConsumer
    private final class State: Sendable {
        let value = Mutex<(messages: [KafkaMessage], assigned: Set<KafkaTopicPartition>, errors: [KafkaError])>(
            ([], [], []))
    }
    private let state = State()
    private let reader: Task<Void, Never>

    init(consumer: KafkaConsumer) {
        self.consumer = consumer
        let state = self.state
        reader = Task { [state] in
            for await event in consumer.events {
                switch event {
                case .messages(let messages): state.value.withLock { $0.messages += messages }
                case .partitionsAssigned(let partitions): state.value.withLock { $0.assigned.formUnion(partitions) }
                case .partitionsRevoked(let partitions, let revocation):
                    state.value.withLock { $0.assigned.subtract(partitions) }
                    revocation.acknowledge()
                case .error(let error): state.value.withLock { $0.errors.append(error) }
                }
            }
        }
    }

    var messages: [KafkaMessage] { state.value.withLock { $0.messages } }
    var assigned: Set<KafkaTopicPartition> { state.value.withLock { $0.assigned } }

    /// Waits until at least `count` messages arrived; returns them.
    func waitForMessages(_ count: Int, timeout: Duration = .seconds(30)) async -> [KafkaMessage] {
        _ = await eventually(timeout: timeout) { self.messages.count >= count }
        return messages
    }

    func close() async {
        await consumer.close()
        await reader.value
    }
}

/// A fresh embedded cluster with the given topics, and configurations pointing at it.
struct TestCluster {
    let cluster: EmbeddedKafkaCluster

    init(brokers: Int = 1, topics: [String: Int]) throws {
        cluster = try EmbeddedKafkaCluster(brokers: brokers)
        for (topic, partitions) in topics { try cluster.createTopic(topic, partitions: partitions) }
    }

    var producerConfiguration: KafkaConfiguration {
        KafkaConfiguration(["bootstrap.servers": cluster.bootstrapServers])
    }

    func consumerConfiguration(group: String) -> KafkaConfiguration {
        KafkaConfiguration([
            "bootstrap.servers": cluster.bootstrapServers, "group.id": group,
            "auto.commit.interval.ms": "200", "session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
        ])
    }
}
