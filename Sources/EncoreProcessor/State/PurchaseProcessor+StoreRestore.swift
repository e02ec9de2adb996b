import EncoreEvents
import Kafka

extension PurchaseProcessor {
    /// Restores `partitions` through the local store (docs/STATE.md): each partition's changelog is
    /// read only from the store's checkpoint to its end (from below it where an earlier restore
    /// read only to a committed end there), applied to the store, and the store's
    /// records are then folded as the changelog's would be. A partition the store cannot vouch for
    /// (none, stale, of another topic, unreadable) is rebuilt from the changelog's beginning.
    static func readLedger(
        through writer: StateStoreWriter, of partitions: [Int32], configuration: ProcessorConfiguration,
        vitals: ProcessorVitals?, logger: Logger
    ) async throws -> [Int32: RestoredPartition] {
        let clock = ContinuousClock()
        let started = clock.now
        // What this instance wrote before (an earlier assignment of these partitions) first.
        writer.flush()
        let store = writer.store
        var kafka = configuration.kafka
        if configuration.guarantee == .exactlyOnce { kafka.setDefault("isolation.level", "read_committed") }
        let admin = try KafkaAdmin(configuration: kafka)
        var marks: [Int32: (low: Int64, high: Int64)] = [:]
        for partition in partitions {
            marks[partition] = try await admin.watermarks(
                of: KafkaTopicPartition(topic: configuration.stateTopic, partition: partition), timeout: .seconds(60))
        }
        var rebuilt: Set<Int32> = []
        vitals?.update {
            $0.restoreTarget = 0
            $0.restoreRead = 0
            $0.restoreFromStore = 0
        }
        var checkpoints: [Int32: StateStore.Checkpoint] = [:]
        // Where an earlier restore left each partition to be read again from (below its checkpoint),
        // and which of those this one reads again.
        var storedRereads: [Int32: Int64] = [:]
        var rereads: [Int32: Int64] = [:]
        for partition in partitions {
            let (low, high) = marks[partition]!
            var checkpoint: StateStore.Checkpoint? = nil
            do { checkpoint = try store.checkpoint(of: partition) } catch {
                logger.warning("the state store's checkpoint of partition \(partition) cannot be read (\(error))")
            }
            var readAgainFrom: Int64? = nil
            if checkpoint != nil {
                do { readAgainFrom = try store.rereadOffset(of: partition) } catch {
                    logger.warning(
                        "the state store's re-read offset of changelog partition \(partition) cannot be read (\(error)): rebuilding it"
                    )
                    checkpoint = nil
                }
            }
            storedRereads[partition] = readAgainFrom
            // At least once, a checkpoint past the reported end is checked by reading the record
            // before it. Exactly-once it is rebuilt, as before: with that read, CI's exactly-once
            // chaos on Tansu once had three members whose restores never settled for the committed
            // end (three 60 s attempts each, then a stop); the reader now settles there, but what a
            // read_committed reader sees past Tansu's short end is untested.
            switch StoreRestorePlan.start(
                checkpoint: checkpoint?.offset, readAgainFrom: readAgainFrom, low: low, high: high,
                rebuildsPastEnd: configuration.openTransactionWait != nil)
            {
            case .checkpoint:
                checkpoints[partition] = checkpoint
            case .readAgain(let from):
                checkpoints[partition] = checkpoint
                rereads[partition] = from
            case .rebuild(let reason):
                if let reason {
                    logger.warning("the state store of changelog partition \(partition) \(reason): rebuilding it")
                }
                rebuilt.insert(partition)
            }
        }
        if !rereads.isEmpty {
            let from = rereads.sorted { $0.key < $1.key }.map {
                "\($0.key) from \($0.value) (checkpoint \(checkpoints[$0.key]!.offset))"
            }
            logger.info(
                "reading changelog partitions again from below their store's checkpoints, where an earlier restore read them only to a committed end: \(from.joined(separator: ", "))"
            )
        }
        // A first pass from the checkpoints (the record before each, to recognise the topic), or
        // from below them for those read again.
        var tail = try await readTail(
            partitions, from: checkpoints, rereads: rereads, marks: marks, store: store, configuration: configuration,
            kafka: kafka, vitals: vitals, logger: logger)
        // Partitions whose record before the checkpoint is not the one the store saw: another
        // topic of the same name. Read again from the beginning.
        let foreign = tail.foreign
        if !foreign.isEmpty {
            logger.warning(
                "the state store of changelog partitions \(foreign.sorted()) does not match the changelog (the topic was created again or truncated: the record before the checkpoint is another or none): rebuilding them"
            )
            rebuilt.formUnion(foreign)
            let again = try await readTail(
                Array(foreign), from: [:], marks: marks, store: store, configuration: configuration, kafka: kafka,
                vitals: vitals, logger: logger)
            tail.records += again.records
            if tail.failure == nil { tail.failure = again.failure }
            tail.unread = tail.unread.filter { !foreign.contains($0.key) }.merging(again.unread) { $1 }
        }
        if let failure = tail.failure {
            throw RocksDBError(description: "cannot write the state store in \(store.directory): \(failure)")
        }
        // Fold what the store holds: the changelog's latest record of each key.
        let cap = configuration.journal.perUserCap
        let horizon = currentTimeMs() - configuration.journal.retentionMs
        var restored: [Int32: RestoredPartition] = [:]
        var stored = 0
        var invalid: [String] = []
        /// Folds one record the store holds of `partition`; one that is not valid is noted.
        func fold(_ key: [UInt8], _ value: [UInt8], of partition: Int32, into folded: inout RestoredPartition) {
            do throws(EventValidationError) {
                try folded.fold(key: key, value: value, horizonMs: horizon)
            } catch {
                invalid.append(
                    "\(configuration.stateTopic)[\(partition)] key \(String(decoding: key, as: UTF8.self)): \(error)")
            }
        }
        /// Folds what the store holds of `user` and counts it read; returns how many records.
        func fold(user: String, of partition: Int32, into folded: inout RestoredPartition) throws -> Int {
            let records = try store.records(ofUser: user, partition: partition)
            for (key, value) in records { fold(key, value, of: partition, into: &folded) }
            folded.users.append(user)
            return records.count
        }
        for partition in partitions {
            var folded = RestoredPartition(journalCap: cap)
            var attempt = 1
            while true {
                folded = RestoredPartition(journalCap: cap)
                let invalidBefore = invalid.count
                let before = stored
                var seen = 0
                do {
                    if configuration.residentUsers != nil {
                        // Only users with an open request now; the others when their records arrive.
                        for user in try store.usersWithOpenRequests(of: partition) {
                            seen += try fold(user: user, of: partition, into: &folded)
                        }
                        stored += seen
                        break
                    }
                    try store.forEachRecord(of: partition) { key, value in
                        seen += 1
                        if seen % 4096 == 0 {
                            let count = before + seen
                            vitals?.update { $0.restoreFromStore = count }
                        }
                        fold(key, value, of: partition, into: &folded)
                    }
                    stored += seen
                    break
                } catch  where attempt == 1 {
                    invalid.removeSubrange(invalidBefore...)
                    // A store that cannot be read (a damaged block): this partition's is rebuilt.
                    logger.warning(
                        "the state store of changelog partition \(partition) cannot be read (\(error)): rebuilding it from the changelog"
                    )
                    attempt += 1
                    let again = try await readTail(
                        [partition], from: [:], marks: marks, store: store, configuration: configuration,
                        kafka: kafka, vitals: vitals, logger: logger)
                    if let failure = again.failure {
                        throw RocksDBError(
                            description: "cannot write the state store in \(store.directory): \(failure)")
                    }
                    tail.records += again.records
                    tail.unread[partition] = again.unread[partition]
                    rebuilt.insert(partition)
                } catch {
                    throw RocksDBError(description: "cannot read the state store in \(store.directory): \(error)")
                }
            }
            restored[partition] = folded
        }
        // Where the next restore reads again (StoreRestorePlan.readAgainAfter): from the committed
        // end of each partition read only to one, unchanged where this read again was held short of
        // the checkpoint, nowhere once a read reached the end. A rebuild reset the partition's
        // offset with its store.
        var heldAgain: [Int32] = []
        for partition in partitions {
            let verdict = rebuilt.contains(partition) ? nil : tail.verdicts[partition]
            if verdict == .heldBeforeCheckpoint { heldAgain.append(partition) }
            let change = StoreRestorePlan.readAgainAfter(
                stored: rebuilt.contains(partition) ? nil : storedRereads[partition], verdict: verdict,
                committedEnd: tail.unread[partition]?.lowerBound)
            do {
                switch change {
                case .unchanged: break
                case .set(let offset): try store.setRereadOffset(offset, of: partition)
                case .remove: try store.setRereadOffset(nil, of: partition)
                }
            } catch {
                throw RocksDBError(description: "cannot write the state store in \(store.directory): \(error)")
            }
        }
        if !heldAgain.isEmpty {
            logger.info(
                "changelog partitions \(heldAgain.sorted()) were held again before their store's checkpoints: read again from the same offsets next time"
            )
        }
        let held = try await heldJournalRecords(
            tail.unread, read: tail.held, configuration: configuration, logger: logger)
        for (partition, range) in tail.unread.sorted(by: { $0.key < $1.key }) {
            let records = held[partition] ?? []
            var folded = restored[partition] ?? RestoredPartition(journalCap: cap)
            if configuration.residentUsers != nil {
                // Their users are read now, as those with an open request in the store are (one
                // read later, when its record arrives, would load over what is taken here).
                for user in Set(records.map(\.userKey)).subtracting(folded.users).sorted() {
                    stored += try fold(user: user, of: partition, into: &folded)
                }
            }
            let taken = folded.takeHeldIntents(records)
            restored[partition] = folded
            logHeld(
                partition, from: range, records: records, taken: taken, configuration: configuration, logger: logger)
        }
        if let first = invalid.first {
            throw KafkaError(
                code: .invalidConfiguration,
                message:
                    "\(invalid.count) changelog records are not valid states or journal records (first: \(first)); remove them or fix the topic"
            )
        }
        // The partitions' store is whole up to its checkpoint: what this instance writes now goes
        // there. Also for a partition read to a committed end short of its end (an open transaction
        // held it; Tansu only, in practice): records committed past that end were not read, and
        // this instance's writes move the checkpoint past them (docs/STATE.md, Restore). Keeping
        // such a partition's writes out of the store instead leaves them in memory only, where a
        // later restore's open-request index does not look: an open intent there would not hold
        // its user (found by reading; tried and reverted).
        writer.restored(partitions)
        let users = restored.values.reduce(0) { $0 + $1.states.count }
        let remembered = restored.values.reduce(0) { $0 + $1.journal.count }
        logger.info(
            "restored the ledger state of \(users) users and \(remembered) journaled requests of \(partitions.count) partitions in \(clock.now - started): \(tail.records) changelog records read from the checkpoints (\(rebuilt.count) partitions rebuilt from the beginning), \(stored) from the state store"
        )
        vitals?.update {
            $0.restoredChangelogRecords += tail.records
            $0.restoredStoreRecords += stored
        }
        return restored
    }

    private struct Tail: Sendable {
        var pending: [Int32: [(key: [UInt8]?, value: [UInt8])]] = [:]
        /// The offset after each partition's last record read.
        var next: [Int32: Int64] = [:]
        /// The partitions read from their beginning, their store reset: what each rebuild wrote.
        var rebuilds: [Int32: StateStore.Rebuild] = [:]
        /// Partitions whose first record read (just before the checkpoint) is not the expected one.
        var mismatched: Set<Int32> = []
        /// Records read again below the checkpoint, applied once its record is read.
        var replay: [Int32: [(key: [UInt8]?, value: [UInt8])]] = [:]
        var verified: Set<Int32> = []
        var records = 0
        var failure: String? = nil
    }

    /// What ``readTail(_:from:rereads:marks:store:configuration:kafka:vitals:logger:)`` read.
    private struct TailRead {
        var records = 0
        /// Of each partition read from its checkpoint, what the read tells of its store.
        var verdicts: [Int32: StoreRestorePlan.Verdict] = [:]
        var failure: String? = nil
        /// Where the read settled short of each partition's end (a committed end), to its end.
        var unread: [Int32: Range<Int64>] = [:]
        /// The held ranges read (without isolation) for records read again: the restore's read of
        /// held journal records takes them rather than reading them twice.
        var held: [Int32: HeldRead] = [:]

        /// Partitions whose store is not this changelog's: rebuilt.
        var foreign: Set<Int32> { Set(verdicts.filter { $0.value == .foreign }.keys) }
    }

    /// How many changelog records a rebuild reads at least for it to pause RocksDB's compactions.
    static let bulkRebuildRecords = 10_000

    /// Reads each partition from its checkpoint (from its beginning without one, its store reset;
    /// from `rereads` below it for those read again) to its end, applying the records to the store
    /// in batches with their checkpoints.
    private static func readTail(
        _ partitions: [Int32], from checkpoints: [Int32: StateStore.Checkpoint], rereads: [Int32: Int64] = [:],
        marks: [Int32: (low: Int64, high: Int64)], store: StateStore, configuration: ProcessorConfiguration,
        kafka: KafkaConfiguration, vitals: ProcessorVitals?, logger: Logger
    ) async throws(KafkaError) -> TailRead {
        let clock = ContinuousClock()
        let started = clock.now
        var starts: [Int32: Int64] = [:]
        for partition in partitions {
            if let checkpoint = checkpoints[partition] {
                // The record before the checkpoint is read again and compared (none at offset 0).
                starts[partition] = min(rereads[partition] ?? .max, max(checkpoint.offset - 1, 0))
            } else {
                do { try store.reset(partition: partition) } catch {
                    return TailRead(failure: "\(error)")
                }
                starts[partition] = marks[partition]!.low
            }
        }
        let batchSize = 4096
        let expected = checkpoints
        // A partition read from its beginning is rebuilt: written without the log, knowing its
        // own index entries (docs/STATE.md, Restore).
        var rebuilds: [Int32: StateStore.Rebuild] = [:]
        for partition in partitions where checkpoints[partition] == nil {
            rebuilds[partition] = StateStore.Rebuild(records: Int(marks[partition]!.high - marks[partition]!.low))
        }
        let target = starts.reduce(0) { $0 + Int(max(0, marks[$1.key]!.high - $1.value)) }
        vitals?.update { $0.restoreTarget += target }
        // A rebuild of many records is a bulk load: RocksDB's compactions paused while it runs, then
        // the rebuilt partitions compacted once, so the records are not rewritten level by level.
        let rebuilt = Array(rebuilds.keys)
        var paused = false
        if rebuilt.reduce(0, { $0 + Int(marks[$1]!.high - marks[$1]!.low) }) >= bulkRebuildRecords {
            do { try store.pauseCompactions() } catch { return TailRead(failure: "\(error)") }
            paused = true
        }
        // The batches are written on a thread of their own while the next ones are read.
        let batches = StateStore.BatchWriter(store)
        defer { batches.finish() }
        /// A rebuild that fails leaves nothing behind: its unlogged batches (a retry would trust
        /// their checkpoint while they are not durable, and logged writes after them would outlive
        /// them in a crash) are deleted.
        func abandon() { store.abandon(rebuilds: rebuilt, writtenBy: batches, paused: paused) }
        let read: KafkaPartitionRead<Tail>
        do {
            read = try await KafkaPartitionReader.fold(
                configuration: kafka, topic: configuration.stateTopic, starts: starts,
                ends: marks.filter { starts[$0.key] != nil }.mapValues(\.high),
                openTransactionWait: configuration.openTransactionWait, readsPastShortEnds: Set(expected.keys),
                into: Tail(rebuilds: rebuilds)
            ) { tail, message in
                let partition = message.partition
                guard tail.failure == nil, !tail.mismatched.contains(partition) else { return }
                if let checkpoint = expected[partition], checkpoint.offset > 0, !tail.verified.contains(partition) {
                    if message.offset < checkpoint.offset - 1, rereads[partition] != nil {
                        // Read again below the checkpoint: kept until the checkpoint's record is
                        // read, then applied in order. Applied before, by a read held short of it,
                        // they would put older values over the newer ones the store holds past
                        // that end.
                        tail.replay[partition, default: []].append((message.key, message.value))
                        return
                    }
                    tail.verified.insert(partition)
                    let same =
                        message.offset == checkpoint.offset - 1
                        && StateStore.digest(key: message.key, value: message.value) == checkpoint.lastDigest
                    let replay = tail.replay.removeValue(forKey: partition)
                    if !same { tail.mismatched.insert(partition) }
                    guard same, let replay else { return }
                    // The checkpoint's record is applied after them too: an older record of its key
                    // may be among them.
                    tail.records += replay.count
                    tail.pending[partition, default: []].append(contentsOf: replay)
                }
                tail.records += 1
                tail.pending[partition, default: []].append((message.key, message.value))
                tail.next[partition] = message.offset + 1
                if tail.records % batchSize == 0 {
                    let read = tail.records
                    vitals?.update { $0.restoreRead = read }
                }
                if tail.pending[partition]!.count >= batchSize {
                    do {
                        // (Synced once at the end of the read: a sync per batch made a rebuild disk-bound.)
                        try store.apply(
                            tail.pending[partition]!, partition: partition,
                            checkpoint: checkpoint(after: tail.pending[partition]!, at: tail.next[partition]!),
                            rebuild: &tail.rebuilds[partition], through: batches)
                        tail.pending[partition] = []
                    } catch {
                        tail.failure = "\(error)"
                    }
                }
            }
        } catch {
            abandon()
            throw error
        }
        let tail = read.state
        var failure = tail.failure
        var written = tail.rebuilds
        var verdicts: [Int32: StoreRestorePlan.Verdict] = [:]
        for (partition, checkpoint) in expected where checkpoint.offset > 0 {
            verdicts[partition] = StoreRestorePlan.verdict(
                checkpoint: checkpoint.offset, readAgain: rereads[partition] != nil,
                recordBefore: tail.verified.contains(partition) ? !tail.mismatched.contains(partition) : nil,
                heldBeforeStart: read.heldBeforeStart.contains(partition),
                committedEnd: read.unread[partition]?.lowerBound)
        }
        // Read again and held short of the checkpoint's record: of what was read again, what can
        // be applied now (StoreRestorePlan.settled).
        let heldReplays = tail.replay.filter { verdicts[$0.key] == .heldBeforeCheckpoint }
        var heldRead: [Int32: HeldRead] = [:]
        if !heldReplays.isEmpty && failure == nil {
            let held: [Int32: [KafkaMessage]]
            do {
                held = try await heldRecords(
                    read.unread.filter { heldReplays[$0.key] != nil }, configuration: configuration)
            } catch {
                abandon()
                throw error
            }
            for (partition, messages) in held {
                heldRead[partition] = HeldRead(range: read.unread[partition]!, messages: messages)
            }
            for (partition, replay) in heldReplays.sorted(by: { $0.key < $1.key }) {
                let settled = StoreRestorePlan.settled(
                    replay, heldKeys: Set((held[partition] ?? []).map { StateStore.HashedBytes($0.key ?? []) }),
                    key: \.key)
                logger.info(
                    "changelog partition \(partition) read again from \(rereads[partition]!) and held at \(read.unread[partition]!.lowerBound), before its store's checkpoint \(expected[partition]!.offset): \(settled.count) of the \(replay.count) records read again applied (their keys have none past the committed end)"
                )
                guard !settled.isEmpty else { continue }
                var none: StateStore.Rebuild? = nil
                do {
                    try store.apply(
                        settled, partition: partition, checkpoint: expected[partition]!, rebuild: &none,
                        through: batches)
                } catch {
                    failure = "\(error)"
                }
            }
        }
        for (partition, records) in tail.pending where !records.isEmpty && failure == nil {
            do {
                try store.apply(
                    records, partition: partition, checkpoint: checkpoint(after: records, at: tail.next[partition]!),
                    rebuild: &written[partition], through: batches)
            } catch {
                failure = "\(error)"
            }
        }
        if failure == nil {
            do {
                let readAt = clock.now
                try batches.drain()
                try store.syncLog()
                let writtenAt = clock.now
                if !rebuilt.isEmpty {
                    try store.finishRebuilds()
                    logger.info(
                        "rebuilt the state store of partitions \(rebuilt.sorted()), \(tail.records) changelog records read in all: read in \(readAt - started), the last batches written in \(writtenAt - readAt), flushed in \(clock.now - writtenAt)"
                    )
                }
                if paused {
                    // (The load is over even if this throws: abandon() must not end it again.)
                    paused = false
                    try store.resumeCompactions(after: rebuilt)
                }
            } catch {
                failure = "\(error)"
            }
        }
        if failure != nil { abandon() }
        return TailRead(
            records: tail.records, verdicts: verdicts, failure: failure, unread: read.unread, held: heldRead)
    }

    /// The checkpoint past `records`, the last of which is just before offset `next`.
    private static func checkpoint(
        after records: [(key: [UInt8]?, value: [UInt8])], at next: Int64
    ) -> StateStore.Checkpoint {
        StateStore.Checkpoint(
            offset: next, lastDigest: StateStore.digest(key: records.last!.key, value: records.last!.value))
    }
}
