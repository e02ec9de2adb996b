/// Reads partitions of a topic from their first record to (at least) their end at the time of the call:
/// how a changelog is restored and how a compacted topic is queried. Joins no group, commits nothing.
public enum KafkaPartitionReader {
    /// Folds every record of `partitions` of `topic` (in offset order per partition) into `initial`.
    /// Throws when the topic cannot be read or the end is not reached within `timeout`.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, partitions: [Int32], timeout: Duration = .seconds(60),
        into initial: State, _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> (state: State, records: Int) {
        var configuration = configuration
        configuration.setDefault("group.id", "encore-partition-reader")
        configuration["enable.auto.commit"] = "false"
        // The end may be a transaction's control record, which is never handed out as a record.
        configuration["enable.partition.eof"] = "true"
        // Folding keeps up with fetching: a small prefetch keeps a large topic from passing through memory at once.
        configuration.setDefault("queued.max.messages.kbytes", "4096")
        let admin = try KafkaAdmin(configuration: configuration)
        var ends: [Int32: Int64] = [:]
        for partition in partitions {
            let marks = try await admin.watermarks(
                of: KafkaTopicPartition(topic: topic, partition: partition), timeout: timeout)
            if marks.high > marks.low { ends[partition] = marks.high }
        }
        guard !ends.isEmpty else { return (initial, 0) }
        let targets = ends
        let consumer = try KafkaConsumer(configuration: configuration, logger: Logger(label: "kafka.reader"))
        try consumer.assign(
            targets.keys.sorted().map { KafkaTopicPartitionOffset(topic: topic, partition: $0, offset: -2) })
        let outcome = await withTaskGroup(of: (State, Int)?.self) { group in
            group.addTask {
                var state = initial
                var remaining = targets
                var records = 0
                for await event in consumer.events {
                    if case .endOfPartition(let partition, let offset) = event {
                        // (read_committed: the end of what is committed, which reaches `end` once
                        // the transactions open there commit or abort.)
                        if let end = remaining[partition.partition], offset >= end {
                            remaining[partition.partition] = nil
                        }
                        if remaining.isEmpty { return (state, records) }
                        continue
                    }
                    guard case .messages(let batch) = event else { continue }
                    // Records past the end are read too: they are as real, and some brokers (Tansu)
                    // report the end as the last record batch's first offset + 1, short of its other
                    // records. A partition is done at the consumer's end-of-partition past the end.
                    for message in batch {
                        update(&state, message)
                        records += 1
                    }
                }
                return nil
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        await consumer.close()
        guard let (state, records) = outcome else {
            throw KafkaError(
                code: .timedOut, message: "reading '\(topic)' did not reach the end of its partitions within \(timeout)"
            )
        }
        return (state, records)
    }
}
