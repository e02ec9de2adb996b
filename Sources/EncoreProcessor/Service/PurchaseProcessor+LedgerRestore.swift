import EncoreEvents
import Kafka

extension PurchaseProcessor {
    static func finishedOffsets(
        of partitions: [KafkaTopicPartition], configuration: ProcessorConfiguration, consumer: KafkaConsumer,
        logger: Logger
    ) async -> (finished: [InputPartition: Set<Int64>], committed: [InputPartition: KafkaTopicPartitionOffset]) {
        do {
            let committed = try await consumer.committed(partitions)
            logger.debug(
                "assigned \(partitions.count) partitions; committed: \(committed.map { "\($0.partition)@\($0.offset)+\(FinishedOffsets.decode($0.metadata, committed: $0.offset).count)" })"
            )
            let byPartition = committed.map { offset in
                let topic: InputPartition.Topic = offset.topic == configuration.requestsTopic ? .requests : .sources
                return (InputPartition(topic: topic, number: offset.partition), offset)
            }
            return (
                Dictionary(
                    byPartition.map { ($0.0, FinishedOffsets.decode($0.1.metadata, committed: $0.1.offset)) },
                    uniquingKeysWith: { first, _ in first }),
                // A partition without a commit reports a negative offset: nothing to carry.
                Dictionary(byPartition.filter { $0.1.offset >= 0 }, uniquingKeysWith: { first, _ in first })
            )
        } catch {
            logger.warning(
                "cannot read committed offsets of the new assignment (\(error)); finished records will be redone")
            return ([:], [:])
        }
    }

    /// Reads the users' ledger state of `partitions` from the changelog: the latest record per user.
    /// A record that is not a valid state is skipped (logged); a changelog that cannot be read after
    /// three attempts is an error, since going on without the state would overwrite it.
    static func restoreLedger(
        of partitions: [Int32], configuration: ProcessorConfiguration, store: StateStoreWriter? = nil,
        vitals: ProcessorVitals? = nil, logger: Logger
    ) async throws(ProcessorError) -> [Int32: RestoredPartition] {
        guard !partitions.isEmpty else { return [:] }
        let clock = ContinuousClock()
        let started = clock.now
        var attempt = 1
        while true {
            do {
                if let store {
                    return try await readLedger(
                        through: store, of: partitions, configuration: configuration, vitals: vitals, logger: logger)
                }
                return try await readLedger(
                    of: partitions, configuration: configuration, logger: logger, since: started, clock: clock)
            } catch  where attempt < 3 && !Task.isCancelled {
                logger.warning("cannot read the changelog '\(configuration.stateTopic)' (\(error)); trying again")
                try? await Task.sleep(for: .seconds(attempt))
                attempt += 1
            } catch {
                throw ProcessorError(
                    .kafka, "cannot restore the ledger state from '\(configuration.stateTopic)': \(error)")
            }
        }
    }

    /// A held range of a partition and its records, read without isolation.
    struct HeldRead: Sendable {
        let range: Range<Int64>
        let messages: [KafkaMessage]
    }

    /// The records a restore could not read (`unread`: each partition's range a `read_committed`
    /// reader could not see, held past its committed end by an open transaction), read
    /// `read_uncommitted`, in offset order per partition.
    static func heldRecords(
        _ unread: [Int32: Range<Int64>], configuration: ProcessorConfiguration
    ) async throws(KafkaError) -> [Int32: [KafkaMessage]] {
        guard !unread.isEmpty else { return [:] }
        var kafka = configuration.kafka
        kafka["isolation.level"] = "read_uncommitted"
        let read = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: configuration.stateTopic, starts: unread.mapValues(\.lowerBound),
            ends: unread.mapValues(\.upperBound), readsPastShortEnds: Set(unread.keys),
            into: [Int32: [KafkaMessage]]()
        ) { found, message in found[message.partition, default: []].append(message) }
        return read.state
    }

    /// The journal records among those a restore could not read (``heldRecords(_:configuration:)``),
    /// in offset order per partition: what ``RestoredPartition/takeHeldIntents(_:)`` takes. `read`:
    /// held ranges already read, reused where the range is the same.
    static func heldJournalRecords(
        _ unread: [Int32: Range<Int64>], read: [Int32: HeldRead] = [:], configuration: ProcessorConfiguration,
        logger: Logger
    ) async throws(KafkaError) -> [Int32: [JournalRecord]] {
        let reused = read.filter { unread[$0.key] == $0.value.range }.mapValues(\.messages)
        let rest = try await heldRecords(unread.filter { reused[$0.key] == nil }, configuration: configuration)
        var records: [Int32: [JournalRecord]] = [:]
        var invalid: [String] = []
        for (partition, messages) in reused.merging(rest, uniquingKeysWith: { $1 }) {
            // (A record with no value is a deletion: nothing open.)
            for message in messages where JournalRecord.isJournalKey(message.key) && !message.value.isEmpty {
                do throws(EventValidationError) {
                    records[partition, default: []].append(try JournalRecord(jsonBytes: message.value))
                } catch {
                    invalid.append("\(message.topic)[\(message.partition)]@\(message.offset): \(error)")
                }
            }
        }
        if let first = invalid.first {
            // (Not a failure: they may never be committed, and a restore held there would fail on them again.)
            logger.warning(
                "\(invalid.count) journal records held past the committed end are not valid and were skipped (first: \(first))"
            )
        }
        return records
    }

    /// Logs what a restore took of what a transaction held past `partition`'s committed end.
    static func logHeld(
        _ partition: Int32, from range: Range<Int64>, records: [JournalRecord], taken: Set<String>,
        configuration: ProcessorConfiguration, logger: Logger
    ) {
        logger.log(
            taken.isEmpty ? .info : .warning,
            "read '\(configuration.stateTopic)' partition \(partition) from offset \(range.lowerBound), held past the committed end, without isolation: \(records.count) journal records; \(taken.count) requests recovered under a new attempt, their calls may have reached billing (a result there counts as its attempt's call, never as an answer: it may never be committed)"
        )
    }

    static func readLedger(
        of partitions: [Int32], configuration: ProcessorConfiguration, logger: Logger,
        since started: ContinuousClock.Instant, clock: ContinuousClock
    ) async throws(KafkaError) -> [Int32: RestoredPartition] {
        var kafka = configuration.kafka
        // Exactly-once: what an aborted (or still open) transaction wrote is not the users' state.
        if configuration.guarantee == .exactlyOnce { kafka.setDefault("isolation.level", "read_committed") }
        let cap = configuration.journal.perUserCap
        let horizon = currentTimeMs() - configuration.journal.retentionMs
        let read = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: configuration.stateTopic, partitions: partitions,
            openTransactionWait: configuration.openTransactionWait,
            into: (latest: [Int32: RestoredPartition](), invalid: [String]())
        ) { folded, message in
            do throws(EventValidationError) {
                try folded.latest[message.partition, default: RestoredPartition(journalCap: cap)].fold(
                    key: message.key, value: message.value, horizonMs: horizon)
            } catch {
                folded.invalid.append("\(message.topic)[\(message.partition)]@\(message.offset): \(error)")
            }
        }
        let (folded, records) = (read.state, read.records)
        // Going on with an older record of the user would forget intents and results: fail closed.
        if let first = folded.invalid.first {
            throw KafkaError(
                code: .invalidConfiguration,
                message:
                    "\(folded.invalid.count) changelog records are not valid states or journal records (first: \(first)); remove them or fix the topic"
            )
        }
        var latest = folded.latest
        let held = try await heldJournalRecords(read.unread, configuration: configuration, logger: logger)
        for (partition, range) in read.unread.sorted(by: { $0.key < $1.key }) {
            let records = held[partition] ?? []
            let taken = latest[partition, default: RestoredPartition(journalCap: cap)].takeHeldIntents(records)
            logHeld(
                partition, from: range, records: records, taken: taken, configuration: configuration, logger: logger)
        }
        let users = latest.values.reduce(0) { $0 + $1.states.count }
        let remembered = latest.values.reduce(0) { $0 + $1.journal.count }
        logger.info(
            "restored the ledger state of \(users) users and \(remembered) journaled requests from \(records) changelog records of \(partitions.count) partitions in \(clock.now - started)"
        )
        return latest
    }
}
