import Synchronization

/// Reads partitions of a topic from their first record to (at least) their end at the time of the call:
/// how a changelog is restored and how a compacted topic is queried. Joins no group, commits nothing.
public enum KafkaPartitionReader {
    /// Folds every record of `partitions` of `topic` (in offset order per partition) into `initial`.
    /// Throws when the topic cannot be read or the end is not reached within `timeout`.
    /// `openTransactionWait` (a `read_committed` reader): how long an open transaction may hold a
    /// partition's readable end short of the end before the partition is read to that committed
    /// end only (logged, and returned in `heldShort`: each such partition's committed end); `nil`:
    /// wait for it up to `timeout`.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, partitions: [Int32], timeout: Duration = .seconds(60),
        openTransactionWait: Duration? = nil, into initial: State,
        _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> KafkaPartitionRead<State> {
        let configuration = readerConfiguration(configuration)
        let admin = try KafkaAdmin(configuration: configuration)
        var ends: [Int32: Int64] = [:]
        for partition in partitions {
            let marks = try await admin.watermarks(
                of: KafkaTopicPartition(topic: topic, partition: partition), timeout: timeout)
            if marks.high > marks.low { ends[partition] = marks.high }
        }
        guard !ends.isEmpty else { return KafkaPartitionRead(state: initial) }
        return try await read(
            configuration: configuration, topic: topic, starts: ends.mapValues { _ in -2 }, ends: ends,
            exact: false, timeout: timeout, openTransactionWait: openTransactionWait, into: initial, update)
    }

    /// Folds the records of each partition from `starts` (an offset) to (at least) `ends` (the
    /// end the caller read from the watermarks), in offset order per partition: what a restore from
    /// a checkpoint reads. Records past the end are read too, and `openTransactionWait` is as with
    /// ``fold(configuration:topic:partitions:timeout:openTransactionWait:into:_:)``.
    ///
    /// `endsAt`: a record at or past a partition's end for which it is true ends that partition's
    /// read and is not folded (a copy that stops at records written after it began, however fast
    /// they come).
    ///
    /// A partition whose start is at or past its end is not read, unless it is in
    /// `readsPastShortEnds`: then it is read to its first end of partition, for a broker that
    /// reports an end short of the records it holds (Tansu: the last record batch's first offset
    /// + 1). Where the start is past the records (the end was right), the offset reset moves the
    /// read (to the beginning: `earliest`, which a start the log no longer holds needs elsewhere),
    /// and the caller sees records other than the one it started at.
    ///
    /// A start past a partition's committed end (`read_committed`: an open transaction began
    /// before it) gets no record and no end of partition from librdkafka, which signals the end
    /// only at the committed end itself: the partition counts as held there from its first
    /// statistics (its fetch position past its last stable offset), and `heldShort` gives that
    /// committed end, below the start.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, starts: [Int32: Int64], ends: [Int32: Int64],
        timeout: Duration = .seconds(60), openTransactionWait: Duration? = nil,
        endsAt: (@Sendable (KafkaMessage) -> Bool)? = nil, readsPastShortEnds: Set<Int32> = [],
        into initial: State, _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> KafkaPartitionRead<State> {
        let ends = ends.filter { partition, end in
            starts[partition].map { $0 < end || readsPastShortEnds.contains(partition) } ?? false
        }
        guard !ends.isEmpty else { return KafkaPartitionRead(state: initial) }
        return try await read(
            configuration: readerConfiguration(configuration), topic: topic,
            starts: starts, ends: ends, exact: false,
            timeout: timeout, openTransactionWait: openTransactionWait, endsAt: endsAt, into: initial, update)
    }

    /// Folds the records of `ranges` (each partition's first offset and the offset it ends before)
    /// of `topic` into `initial`, in offset order per partition; records past a range are skipped.
    public static func fold<State: Sendable>(
        configuration: KafkaConfiguration, topic: String, ranges: [Int32: Range<Int64>],
        timeout: Duration = .seconds(60), into initial: State,
        _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> KafkaPartitionRead<State> {
        let ranges = ranges.filter { !$0.value.isEmpty }
        guard !ranges.isEmpty else { return KafkaPartitionRead(state: initial) }
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
        timeout: Duration, openTransactionWait: Duration? = nil, endsAt: (@Sendable (KafkaMessage) -> Bool)? = nil,
        into initial: State,
        _ update: @escaping @Sendable (inout State, KafkaMessage) -> Void
    ) async throws(KafkaError) -> KafkaPartitionRead<State> {
        let targets = ends
        let logger = Logger(label: "kafka.reader")
        // The fold sets the pace: records wait in librdkafka's small queue, not in memory here.
        let admission = KafkaAdmission(capacity: 8192, stallLimit: .seconds(30))
        var configuration = configuration
        // A reader that may settle for a committed end watches each partition's last stable offset.
        if openTransactionWait != nil { configuration["statistics.interval.ms"] = "500" }
        let consumer = try KafkaConsumer(configuration: configuration, admission: admission, logger: logger)
        try consumer.assign(
            targets.keys.sorted().map { KafkaTopicPartitionOffset(topic: topic, partition: $0, offset: starts[$0]!) })
        // Only a reader that may settle for a committed end keeps track of the ends held short.
        let held = openTransactionWait.map { _ in HeldEnds() }
        // Batches folded: the timeout counts from the last one, so a long read that keeps going
        // (millions of records) is never cut short, and a stalled one ends after `timeout`.
        let progress = ReadProgress()
        let outcome = await withTaskGroup(of: ReadEnding<State>.self) { group in
            group.addTask {
                var state = initial
                var remaining = targets
                var records = 0
                for await event in consumer.events {
                    if case .endOfPartition(let partition, let offset) = event {
                        // (read_committed: the end of what is committed, which reaches `end` once
                        // the transactions open there commit or abort.)
                        if let end = remaining[partition.partition] {
                            if offset >= end {
                                remaining[partition.partition] = nil
                                held?.reached(partition.partition)
                            } else {
                                held?.heldShort(partition.partition, at: offset, end: end)
                            }
                        }
                        if remaining.isEmpty { return .read(state, records) }
                        continue
                    }
                    guard case .messages(let batch) = event else { continue }
                    defer { admission.release(batch.count) }
                    progress.batches.add(1, ordering: .relaxed)
                    // Records past the end are read too: they are as real, and some brokers (Tansu)
                    // report the end as the last record batch's first offset + 1, short of its other
                    // records. A partition is done at the consumer's end-of-partition past the end.
                    var moved: Int32 = -1
                    for message in batch {
                        // (Once per run of one partition's records: the lock is off the per-record path.)
                        if message.partition != moved {
                            moved = message.partition
                            held?.moved(moved)
                        }
                        if exact {
                            // Done at the range's last offset, or past it (a control record may hold it).
                            guard let end = remaining[message.partition] else { continue }
                            if message.offset >= end - 1 {
                                remaining[message.partition] = nil
                                held?.reached(message.partition)
                            }
                            if message.offset >= end { continue }
                        } else if let endsAt, let end = targets[message.partition], message.offset >= end,
                            endsAt(message)
                        {
                            if remaining.removeValue(forKey: message.partition) != nil {
                                held?.reached(message.partition)
                            }
                            continue
                        }
                        if !exact && endsAt != nil && remaining[message.partition] == nil { continue }
                        update(&state, message)
                        records += 1
                    }
                    if (exact || endsAt != nil) && remaining.isEmpty { return .read(state, records) }
                }
                // Ended by ``ReadEnding/settle``: what was read is the committed part.
                return Task.isCancelled && held?.settled == true ? .read(state, records) : .timedOut
            }
            group.addTask {
                let clock = ContinuousClock()
                var seen = 0
                var since = clock.now
                while !Task.isCancelled {
                    try? await Task.sleep(for: min(timeout, .seconds(1)))
                    let now = progress.batches.load(ordering: .relaxed)
                    if now != seen {
                        (seen, since) = (now, clock.now)
                    } else if clock.now - since >= timeout {
                        break
                    }
                }
                return .timedOut
            }
            if let openTransactionWait, let held {
                group.addTask {
                    // Every partition still read is held short for the wait: settle for the committed end.
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(250))
                        // Read from past the committed end: held there, though no end of partition comes.
                        for (key, partition) in consumer.statistics.partitions where key.topic == topic {
                            guard let end = targets[key.partition], partition.lastStableOffset >= 0 else { continue }
                            if partition.nextOffset > partition.lastStableOffset {
                                held.heldPastStart(
                                    key.partition, committedEnd: partition.lastStableOffset,
                                    start: partition.nextOffset, end: end)
                            } else {
                                held.notPastStart(key.partition)
                            }
                        }
                        if held.settle(remaining: targets.count, after: openTransactionWait) { return .settle }
                    }
                    return .timedOut
                }
            }
            var first = await group.next() ?? .timedOut
            if case .settle = first {
                group.cancelAll()
                // The reader, cancelled, returns what it folded; the timer, cancelled too, ends at
                // once with `.timedOut`, and may end first: the reader's answer is the one taken.
                // (Taking the next to end reported a settled read as a timeout about half the
                // time, and a restore that lost three times stopped the processor.)
                first = .timedOut
                while let next = await group.next() {
                    if case .read = next { first = next }
                }
            }
            group.cancelAll()
            return first
        }
        await consumer.close()
        if Task.isCancelled, case .timedOut = outcome {
            // (The reader and its timer end alike when cancelled: not a timeout.)
            throw KafkaError(code: .cancelled, message: "reading '\(topic)' was cancelled before it reached the end")
        }
        guard case .read(let state, let records) = outcome else {
            throw KafkaError(
                code: .timedOut,
                message: "reading '\(topic)' did not reach the end of its partitions: no record for \(timeout)"
            )
        }
        let (shortEnds, unread) = held?.ends ?? ([:], [:])
        for (partition, short) in shortEnds.sorted(by: { $0.key < $1.key }) {
            if let start = short.start {
                logger.warning(
                    "reading '\(topic)' partition \(partition) from offset \(start): a transaction open for \(openTransactionWait ?? .zero) holds what is committed at offset \(short.offset), before the start (the end is \(short.end)); nothing of it read (the transaction's records are not committed)"
                )
            } else {
                logger.warning(
                    "reading '\(topic)' partition \(partition): a transaction open for \(openTransactionWait ?? .zero) holds what is committed at offset \(short.offset), short of the end \(short.end); read to the committed end (the transaction's records are not committed)"
                )
            }
        }
        return KafkaPartitionRead(
            state: state, records: records, heldShort: shortEnds.mapValues(\.offset),
            heldBeforeStart: Set(shortEnds.filter { $0.value.start != nil }.keys),
            unread: unread)
    }
}

/// What a ``KafkaPartitionReader`` fold read.
public struct KafkaPartitionRead<State: Sendable>: Sendable {
    public var state: State
    /// Records folded.
    public var records: Int = 0
    /// Partitions read to a committed end short of their end (an open transaction held them for
    /// the reader's `openTransactionWait`): that committed end, which is below the read's start
    /// where the read began past it.
    public var heldShort: [Int32: Int64] = [:]
    /// Those of them whose read began past the committed end: nothing of them was read.
    public var heldBeforeStart: Set<Int32> = []
    /// What of each of them a `read_committed` reader could not see: from the committed end (also
    /// where the read began past it) to the end the reader aimed at (which a broker may report
    /// short of its last records).
    public var unread: [Int32: Range<Int64>] = [:]
}

private enum ReadEnding<State: Sendable>: Sendable {
    case read(State, Int)
    /// Every partition still read is held short of its end by an open transaction.
    case settle
    case timedOut
}

/// ``HeldEndsTable`` shared by the reader and its watch, on the clock.
private final class HeldEnds: Sendable {
    private let table = Mutex(HeldEndsTable())

    func heldShort(_ partition: Int32, at offset: Int64, end: Int64) {
        table.withLock { $0.heldShort(partition, at: offset, end: end, now: .now) }
    }

    func heldPastStart(_ partition: Int32, committedEnd: Int64, start: Int64, end: Int64) {
        table.withLock { $0.heldPastStart(partition, committedEnd: committedEnd, start: start, end: end, now: .now) }
    }

    func notPastStart(_ partition: Int32) { table.withLock { $0.notPastStart(partition) } }

    func moved(_ partition: Int32) { table.withLock { $0.moved(partition) } }

    func reached(_ partition: Int32) { table.withLock { $0.reached(partition) } }

    func settle(remaining count: Int, after wait: Duration) -> Bool {
        table.withLock { $0.settle(remaining: count, after: wait, now: .now) }
    }

    var settled: Bool { table.withLock { $0.settled } }

    /// The table's `shortEnds` and `unread`, read together.
    var ends: ([Int32: (offset: Int64, end: Int64, start: Int64?)], [Int32: Range<Int64>]) {
        table.withLock { ($0.shortEnds, $0.unread) }
    }
}

/// How many batches a read folded, for its stall timeout.
private final class ReadProgress: Sendable {
    let batches = Atomic<Int>(0)
}
