import Foundation
import Kafka
import Synchronization

/// Keeps the local store up with what this instance writes to the changelog: the producer hands
/// over each acknowledged changelog record with its offset (``acknowledged(_:worker:)``), and
/// every interval the records gathered are applied per partition with the checkpoint just past
/// the last one (docs/STATE.md).
///
/// Exactly-once: a worker's records are held until its transaction commits
/// (``transactionEnded(worker:committed:)``), so the store never holds what a transaction that
/// aborted wrote, nor moves its checkpoint past a transaction still open.
///
/// A checkpoint is never written past a record the store does not hold: records go only to
/// partitions restored in this process (``restored(_:)``), and a partition whose write failed, or
/// one of whose changelog records failed delivery (it may be in the topic all the same), takes no
/// more records until it is restored again: its store stays at its last checkpoint, and the next
/// restore reads the changelog from there.
///
/// It is also where a worker that keeps only some users in memory reads the others
/// (``UserStateSource``): the store, overlaid by the records acknowledged and not yet written
/// there (exactly-once, those of the open transaction too: they are what the worker knew).
final class StateStoreWriter: UserStateSource {
    private struct Pending {
        var records: [(key: [UInt8]?, value: [UInt8])] = []
        /// Each record's number in ``State/overlay``.
        var serials: [UInt64] = []
        var checkpoint = StateStore.Checkpoint(offset: 0, lastDigest: 0)
    }

    /// A record acknowledged and not yet in the store, numbered in the order it came.
    private struct Unwritten {
        var serial: UInt64
        var value: [UInt8]
    }

    private struct State {
        /// Records ready for the store, per changelog partition, in offset order.
        var ready: [Int32: Pending] = [:]
        /// Exactly-once: each worker's records of its open transaction, with their serials.
        var held: [Int: [(delivery: KafkaDelivery, serial: UInt64)]] = [:]
        /// Records acknowledged and not in the store yet, per partition, user and changelog key:
        /// what a user read from the store must be overlaid with. A partition whose records the
        /// store does not take (not restored yet, or its write failed) keeps them until restored.
        var overlay: [Int32: [String: [[UInt8]: Unwritten]]] = [:]
        var serial: UInt64 = 0
        var failure: String? = nil
        var stopped = false
        /// Changelog partitions whose requests partition this instance owns (or is restoring).
        var owned: Set<Int32> = []
        /// Partitions held in the store but not owned, since when.
        var unownedSince: [Int32: ContinuousClock.Instant] = [:]
        var nextSweep: ContinuousClock.Instant? = nil
        /// Partitions restored in this process whose store is whole up to its checkpoint: the
        /// only ones records are written to.
        var writable: Set<Int32> = []
        /// RocksDB's memory and disk, as last sampled on the writer's thread, and when.
        var usage = StateStore.Usage()
        var sampledAt: ContinuousClock.Instant? = nil
    }

    let store: StateStore
    private let transactional: Bool
    /// How long a partition this instance no longer owns stays in the store: a quick hand-back
    /// restores only the tail (``ProcessorConfiguration/stateUnownedGrace``).
    private let grace: Duration
    private let state = Mutex(State())
    /// One flush at a time, so that a partition's batches reach the store in order.
    private let flushing = Mutex(())
    private let logger: Logger

    init(
        store: StateStore, transactional: Bool, interval: Duration, grace: Duration = .seconds(600), logger: Logger
    ) {
        self.store = store
        self.transactional = transactional
        self.grace = grace
        self.logger = logger
        Thread.startNamed("encore.store") { [weak self] in
            // (The writer is held only while it works, not while the thread sleeps.)
            func work() -> Bool {
                guard let writer = self, !writer.state.withLock(\.stopped) else { return false }
                writer.flush()
                writer.sweep(now: .now)
                writer.sampleUsage(now: .now)
                return true
            }
            while work() { Thread.sleep(forTimeInterval: Double(interval.milliseconds) / 1000) }
        }
    }

    /// Acknowledged deliveries from a worker's producer (on the producer's thread): the changelog
    /// records among them (those that come back with their record) go to the store.
    func acknowledged(_ deliveries: [KafkaDelivery], worker: Int) {
        let records = deliveries.filter { $0.error == nil && $0.record != nil && $0.offset >= 0 }
        // A changelog record that failed delivery may be in the topic all the same (a timeout):
        // its partition's checkpoint must not pass it.
        let failed = deliveries.compactMap { delivery in
            delivery.error == nil || delivery.record?.topic != store.topic ? nil : delivery.record?.partition
        }
        guard !records.isEmpty || !failed.isEmpty else { return }
        state.withLock { state in
            if !failed.isEmpty { Self.stopWriting(Set(failed), in: &state) }
            let serials = Self.overlay(records, in: &state)
            if transactional {
                state.held[worker, default: []].append(contentsOf: zip(records, serials).map { ($0, $1) })
            } else {
                Self.add(records, serials: serials, to: &state.ready)
            }
        }
    }

    /// Numbers the records and puts them in the overlay.
    private static func overlay(_ deliveries: [KafkaDelivery], in state: inout State) -> [UInt64] {
        deliveries.map { delivery in
            state.serial += 1
            guard let record = delivery.record, let partition = record.partition else { return state.serial }
            let key = record.key ?? []
            let user = String(decoding: StateStore.user(ofChangelogKey: key).user, as: UTF8.self)
            state.overlay[partition, default: [:]][user, default: [:]][key] = Unwritten(
                serial: state.serial, value: record.value)
            return state.serial
        }
    }

    /// Takes the records out of the overlay unless a later record of their key replaced them.
    private static func removeFromOverlay(
        _ records: [(key: [UInt8]?, value: [UInt8])], serials: [UInt64], partition: Int32, in state: inout State
    ) {
        for (record, serial) in zip(records, serials) {
            let key = record.key ?? []
            let user = String(decoding: StateStore.user(ofChangelogKey: key).user, as: UTF8.self)
            guard state.overlay[partition]?[user]?[key]?.serial == serial else { continue }
            state.overlay[partition]![user]![key] = nil
            if state.overlay[partition]![user]!.isEmpty { state.overlay[partition]![user] = nil }
        }
        if state.overlay[partition]?.isEmpty == true { state.overlay[partition] = nil }
    }

    // MARK: Users read back (UserStateSource)

    /// The overlay is read before the store: a flush running meanwhile writes a record to the store
    /// before it leaves the overlay, so each record is found in one or the other; the overlay's is
    /// the newer. (No record of the user arrives meanwhile: a worker reads only users it has no
    /// unacknowledged update of.)
    func records(ofUser key: String, partition: Int32) throws -> [(key: [UInt8], value: [UInt8])] {
        let unwritten = state.withLock { $0.overlay[partition]?[key] } ?? [:]
        var found = try store.records(ofUser: key, partition: partition)
        guard !unwritten.isEmpty else { return found }
        found.removeAll { unwritten[$0.key] != nil }
        let newer = unwritten.sorted { $0.value.serial < $1.value.serial }.map { (key: $0.key, value: $0.value.value) }
        return found + newer
    }

    func dueUsers(
        of partition: Int32, after cursor: [UInt8]?, throughMs: Int64, limit: Int
    ) throws -> (users: [String], cursor: [UInt8]?) {
        try store.dueUsers(of: partition, after: cursor, throughMs: throughMs, limit: limit)
    }

    func takesWrites(of partition: Int32) -> Bool { state.withLock { $0.writable.contains(partition) } }

    func hasUnwritten(user key: String, partition: Int32) -> Bool {
        state.withLock { $0.overlay[partition]?[key] != nil }
    }

    /// Exactly-once: the worker's transaction committed (its records go to the store) or aborted
    /// (they never will: the transaction's records are not the changelog's).
    func transactionEnded(worker: Int, committed: Bool) {
        state.withLock { state in
            let held = state.held.removeValue(forKey: worker) ?? []
            if committed {
                Self.add(held.map(\.delivery), serials: held.map(\.serial), to: &state.ready)
            } else {
                for (delivery, serial) in held {
                    guard let record = delivery.record, let partition = record.partition else { continue }
                    Self.removeFromOverlay(
                        [(record.key, record.value)], serials: [serial], partition: partition, in: &state)
                }
            }
        }
    }

    /// The partitions' store stays at its last checkpoint until they are restored again.
    private static func stopWriting(_ partitions: Set<Int32>, in state: inout State) {
        state.writable.subtract(partitions)
        for partition in partitions { state.ready[partition] = nil }
    }

    /// The partitions were restored (their store brought to the changelog's end): records may go
    /// to them.
    /// The overlay's records of those partitions (acknowledged, so read back by the restore) go,
    /// but an open transaction's.
    func restored(_ partitions: [Int32]) {
        state.withLock { state in
            state.writable.formUnion(partitions)
            let held = Set(state.held.values.joined().map(\.serial))
            for partition in partitions {
                state.overlay[partition] = state.overlay[partition]?.compactMapValues { records in
                    let kept = records.filter { held.contains($0.value.serial) }
                    return kept.isEmpty ? nil : kept
                }
                if state.overlay[partition]?.isEmpty == true { state.overlay[partition] = nil }
            }
        }
    }

    private static func add(_ deliveries: [KafkaDelivery], serials: [UInt64], to ready: inout [Int32: Pending]) {
        // The last record of each partition: the one its checkpoint follows.
        var last: [Int32: (offset: Int64, key: [UInt8]?, value: [UInt8])] = [:]
        for (delivery, serial) in zip(deliveries, serials) {
            guard let record = delivery.record, let partition = record.partition else { continue }
            // (In place: a copy taken out of the dictionary would copy the records at each append.)
            ready[partition, default: Pending()].records.append((record.key, record.value))
            ready[partition]!.serials.append(serial)
            if delivery.offset >= last[partition]?.offset ?? -1 {
                last[partition] = (delivery.offset, record.key, record.value)
            }
        }
        // Acknowledgements of one partition come in offset order: the checkpoint only moves on.
        for (partition, record) in last where record.offset >= ready[partition]!.checkpoint.offset {
            ready[partition]!.checkpoint = StateStore.Checkpoint(
                offset: record.offset + 1, lastDigest: StateStore.digest(key: record.key, value: record.value))
        }
    }

    /// Applies what is ready to the store, all partitions in one atomic, synced write with their
    /// checkpoints; returns once it is durable. When the write fails the partitions in it take no
    /// more records until they are restored again (logged once).
    func flush() {
        flushing.withLock { _ in
            guard !state.withLock(\.stopped) else { return }
            let ready = state.withLock { state in
                defer { state.ready.removeAll(keepingCapacity: true) }
                return state.ready.filter { state.writable.contains($0.key) }
            }
            guard !ready.isEmpty else { return }
            do {
                try store.apply(ready.map { ($0.key, $0.value.records, $0.value.checkpoint) })
                state.withLock { state in
                    for (partition, pending) in ready {
                        Self.removeFromOverlay(
                            pending.records, serials: pending.serials, partition: partition, in: &state)
                    }
                }
            } catch {
                let first = state.withLock { state in
                    Self.stopWriting(Set(ready.keys), in: &state)
                    defer { state.failure = state.failure ?? "\(error)" }
                    return state.failure == nil
                }
                if first {
                    logger.error(
                        "cannot write the state store in \(store.directory) (\(error)); its partitions stay at their last checkpoint until restored again"
                    )
                }
            }
        }
    }

    /// RocksDB's memory and disk as last sampled (every second, on the writer's thread: a read of
    /// the store's properties never meets its close).
    var usage: StateStore.Usage { state.withLock(\.usage) }

    private func sampleUsage(now: ContinuousClock.Instant) {
        guard state.withLock({ $0.sampledAt.map { now - $0 >= .seconds(1) } ?? true }) else { return }
        flushing.withLock { _ in
            guard !state.withLock(\.stopped) else { return }
            let usage = store.usage
            state.withLock {
                $0.usage = usage
                $0.sampledAt = now
            }
        }
    }

    /// The partitions are assigned: kept, and restored (from their checkpoint) before use.
    func assigned(_ partitions: [Int32]) {
        state.withLock { state in
            state.owned.formUnion(partitions)
            for partition in partitions { state.unownedSince[partition] = nil }
        }
    }

    /// The partitions went to another instance: dropped from the store once unowned for the grace.
    /// What is ready is written first (at a clean stop, the last records: a restart then reads no
    /// changelog); their records still coming are not written (the checkpoint stays before them,
    /// and the next restore reads them): a restore of the partitions must not run beside a flush
    /// of them.
    func revoked(_ partitions: [Int32], now: ContinuousClock.Instant = .now) {
        flush()
        state.withLock { state in
            Self.stopWriting(Set(partitions), in: &state)
            state.owned.subtract(partitions)
            for partition in partitions { state.unownedSince[partition] = now }
        }
    }

    /// Drops the partitions unowned for longer than the grace (those found in the store at the
    /// first sweep count from then). Under the flush's lock, which a restore takes after
    /// ``assigned(_:)``: a partition assigned meanwhile is never dropped under its restore.
    func sweep(now: ContinuousClock.Instant) {
        guard state.withLock({ state in state.nextSweep.map { now >= $0 } ?? true }) else { return }
        flushing.withLock { _ in
            guard !state.withLock(\.stopped) else { return }
            let stored = (try? store.storedPartitions()) ?? []
            let due = state.withLock { state -> [Int32] in
                state.nextSweep = now.advanced(by: min(grace, .seconds(10)))
                for partition in stored where !state.owned.contains(partition) && state.unownedSince[partition] == nil {
                    state.unownedSince[partition] = now
                }
                let due = state.unownedSince.filter { now >= $0.value.advanced(by: grace) }.keys.sorted()
                for partition in due { state.unownedSince[partition] = nil }
                return due.filter { stored.contains($0) && !state.owned.contains($0) }
            }
            state.withLock { state in
                Self.stopWriting(Set(due), in: &state)
                for partition in due { state.overlay[partition] = nil }
            }
            for partition in due {
                do {
                    try store.reset(partition: partition)
                    logger.info("dropped changelog partition \(partition) from the state store: not owned for \(grace)")
                } catch {
                    logger.warning("cannot drop changelog partition \(partition) from the state store: \(error)")
                }
            }
        }
    }

    /// Writes what is ready, stops the flushing thread and closes the store (before the process
    /// exits: RocksDB's background threads must not outlive it). Nothing may use the store after.
    func stop() {
        flush()
        flushing.withLock { _ in
            let first = state.withLock { state in
                defer { state.stopped = true }
                return !state.stopped
            }
            if first { store.close() }
        }
    }
}
