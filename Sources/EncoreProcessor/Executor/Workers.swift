import Kafka
import Synchronization

/// Which worker owns a partition: partition number modulo the number of workers, the same for
/// the requests and the sources topic, so a user's records and ledger state stay on one worker.
struct WorkerRouter {
    let count: Int

    func worker(of partition: Int32) -> Int { Int(partition) % count }

    /// `items` by owning worker, in their order; workers with none are left out.
    func split<T>(_ items: [T], by partition: (T) -> Int32) -> [(worker: Int, items: [T])] {
        guard count > 1 else { return items.isEmpty ? [] : [(0, items)] }
        var parts = [[T]](repeating: [], count: count)
        for item in items { parts[worker(of: partition(item))].append(item) }
        return parts.enumerated().filter { !$0.element.isEmpty }.map { ($0.offset, $0.element) }
    }
}

/// A worker's view of the shared producer: its tokens carry the worker's number, so deliveries
/// find their way back to it.
struct WorkerProducer: OutputProducer {
    let producer: any OutputProducer
    let worker: Int
    let workers: Int

    func produce(_ buffer: borrowing KafkaRecordBuffer, token: UInt) throws(KafkaError) {
        try producer.produce(buffer, token: token * UInt(workers) + UInt(worker))
    }

    /// Deliveries by worker, with the worker's own tokens.
    static func split(_ deliveries: [KafkaDelivery], workers: Int) -> [(worker: Int, items: [KafkaDelivery])] {
        guard workers > 1 else { return [(0, deliveries)] }
        var parts = [[KafkaDelivery]](repeating: [], count: workers)
        for var delivery in deliveries {
            let worker = Int(delivery.token % UInt(workers))
            delivery.token /= UInt(workers)
            parts[worker].append(delivery)
        }
        return parts.enumerated().filter { !$0.element.isEmpty }.map { ($0.offset, $0.element) }
    }
}

/// A revocation split among workers: the consumer's revocation is acknowledged, with every
/// worker's offsets, once each worker has handed over its share; each learns the commit's fate.
final class RevocationHandOver: Sendable {
    private typealias Committed = @Sendable (KafkaError?) -> Void
    private let revocation: KafkaRevocation
    private let state: Mutex<(remaining: Int, offsets: [KafkaTopicPartitionOffset], committed: [Committed])>

    init(_ revocation: KafkaRevocation, parts: Int) {
        self.revocation = revocation
        state = Mutex((parts, [], []))
        if parts == 0 { revocation.acknowledge() }
    }

    func acknowledge(
        committing offsets: [KafkaTopicPartitionOffset], committed: @escaping @Sendable (KafkaError?) -> Void
    ) {
        let all = state.withLock { state -> ([KafkaTopicPartitionOffset], [Committed])? in
            state.offsets += offsets
            state.committed.append(committed)
            state.remaining -= 1
            return state.remaining == 0 ? (state.offsets, state.committed) : nil
        }
        if let (offsets, waiting) = all {
            revocation.acknowledge(committing: offsets) { error in
                for committed in waiting { committed(error) }
            }
        }
    }
}
