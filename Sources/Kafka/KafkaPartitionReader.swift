/// Reads partitions of a topic from their first record to (at least) their end at the time of the call:
/// how a changelog is restored and how a compacted topic is queried. Joins no group, commits nothing.
public enum KafkaPartitionReader {
    /// Folds every record of `partitions` of `topic` (in offset order per partition) into `initial`.
    /// Throws when the topic cannot be read or the end is not reached within `timeout`.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, partitions: [Int32], timeout: Duration = .seconds(60),
        into initial: State, _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> (state: State, records: Int) {
        let configuration = readerConfiguration(configuration)
        let admin = try KafkaAdmin(configuration: configuration)
        var ends: [Int32: Int64] = [:]
        for partition in partitions {
            let marks = try await admin.watermarks(
                of: KafkaTopicPartition(topic: topic, partition: partition), timeout: timeout)
            if marks.high > marks.low { ends[partition] = marks.high }
        }
        guard !ends.isEmpty else { return (initial, 0) }
        return try await read(
            configuration: configuration, topic: topic, starts: ends.mapValues { _ in -2 }, ends: ends,
            exact: false, timeout: timeout, into: initial, update)
    }

    /// Folds the records of each partition from `starts` (an offset) to (at least) `ends` (the
    /// end the caller read from the watermarks), in offset order per partition: what a restore from
    /// a checkpoint reads. Records past the end are read too, as with ``fold(configuration:topic:partitions:timeout:into:_:)``.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, starts: [Int32: Int64], ends: [Int32: Int64],
        timeout: Duration = .seconds(60), into initial: State,
        _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> (state: State, records: Int) {
        let ends = ends.filter { partition, end in starts[partition].map { $0 < end } ?? false }
        guard !ends.isEmpty else { return (initial, 0) }
        return try await read(
            configuration: readerConfiguration(configuration), topic: topic, starts: starts, ends: ends, exact: false,
            timeout: timeout, into: initial, update)
    }

    /// Folds the records of `ranges` (each partition's first offset and the offset it ends before)
    /// of `topic` into `initial`, in offset order per partition; records past a range are skipped.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, ranges: [Int32: Range<Int64>],
        timeout: Duration = .seconds(60), into initial: State,
        _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> (state: State, records: Int) {
        let ranges = ranges.filter { !$0.value.isEmpty }
        guard !ranges.isEmpty else { return (initial, 0) }
        return try await read(
            configuration: readerConfiguration(configuration), topic: topic,
            starts: ranges.mapValues(\.lowerBound), ends: ranges.mapValues(\.upperBound), exact: true,
            timeout: timeout, into: initial, update)
    }

    private static func readerConfiguration(_ configuration: KafkaConfiguration) -> KafkaConfiguration {
        var configuration = configuration
        configuration.setDefault("group.id", "encore-partition-reader")
        configuration["enable.auto.commit"] = "false"
        // The end may be a transaction's control record, which is never handed out as a record.
        configuration["enable.partition.eof"] = "true"
        // Folding keeps up with fetching: a small prefetch keeps a large topic from passing through memory at once.
        configuration.setDefault("queued.max.messages.kbytes", "4096")
        // From librdkafka 2.1 on, a full prefetch queue is refilled only after this (1 s by default):
        // with a small queue, reading a large topic was a second's wait every 4 MiB (an audit of a
        // million requests on Tansu waited 8 of its 9 minutes).
        if LibrdkafkaVersion.isAtLeast(2, 1) { configuration.setDefault("fetch.queue.backoff.ms", "10") }
        return configuration
    }

    /// Reads each partition from `starts` to `ends`; `exact`: records at or past the end are
    /// skipped and the partition is done on reaching it; otherwise they are read too.
    private static func read<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, starts: [Int32: Int64], ends: [Int32: Int64], exact: Bool,
        timeout: Duration, into initial: State, _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> (state: State, records: Int) {
        let targets = ends
        // The fold sets the pace: records wait in librdkafka's small queue, not in memory here.
        let admission = KafkaAdmission(capacity: 8192, stallLimit: .seconds(30))
        let consumer = try KafkaConsumer(
            configuration: configuration, admission: admission, logger: Logger(label: "kafka.reader"))
        try consumer.assign(
            targets.keys.sorted().map { KafkaTopicPartitionOffset(topic: topic, partition: $0, offset: starts[$0]!) })
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
                    defer { admission.release(batch.count) }
                    // Records past the end are read too: they are as real, and some brokers (Tansu)
                    // report the end as the last record batch's first offset + 1, short of its other
                    // records. A partition is done at the consumer's end-of-partition past the end.
                    for message in batch {
                        if exact {
                            // Done at the range's last offset, or past it (a control record may hold it).
                            guard let end = remaining[message.partition] else { continue }
                            if message.offset >= end - 1 { remaining[message.partition] = nil }
                            if message.offset >= end { continue }
                        }
                        update(&state, message)
                        records += 1
                    }
                    if exact && remaining.isEmpty { return (state, records) }
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
