import Foundation
import Kafka
import TestSupport
import Synchronization

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
                case .endOfPartition: break
                }
            }
        }
    }

    var messages: [KafkaMessage] { state.value.withLock { $0.messages } }
    var assigned: Set<KafkaTopicPartition> { state.value.withLock { $0.assigned } }

    /// Waits until at least `count` messages arrived; returns them. With `eventually`'s deadline:
    /// beside `stress-ng`, the suite's other tests kept the cooperative pool, and this probe's
    /// reader with it, busy for 28 s once, and a 30 s wait after a 3 s group join ran out.
    func waitForMessages(_ count: Int) async -> [KafkaMessage] {
        _ = await eventually { self.messages.count >= count }
        return messages
    }

    func close() async {
        await consumer.close()
        await reader.value
    }
}
