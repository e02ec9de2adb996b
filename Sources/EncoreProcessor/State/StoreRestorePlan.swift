/// What a restore through the local state store decides for each changelog partition, without
/// I/O (docs/STATE.md, Restore): where it reads from, what a read decides about the store, and
/// where the next restore reads again from. `PurchaseProcessor+StoreRestore` performs these
/// choices; `state-check` makes the same first one to say what a restore would do.
enum StoreRestorePlan {
    /// Where a restore reads a changelog partition from.
    enum Start: Equatable {
        /// From the store's checkpoint (the record before it, to recognise the topic).
        case checkpoint
        /// From `from`, below the checkpoint: an earlier restore read only to a committed end there,
        /// and what others committed past it may be missing from the store.
        case readAgain(from: Int64)
        /// From the changelog's beginning, the store's partition reset; `reason` is why (none for a
        /// store that never had the partition).
        case rebuild(reason: String?)
    }

    /// At most how many offsets below its checkpoint a partition is read again from (its records
    /// are held in memory until the checkpoint's record is read): a partition farther from it is
    /// rebuilt instead.
    static let readAgainLimit: Int64 = 100_000

    /// Where to read a partition whose store has `checkpoint` (nil: none) and, from an earlier
    /// restore, `readAgainFrom` (nil: none), in a changelog partition of watermarks `low..<high`.
    /// `rebuildsPastEnd`: exactly-once, a checkpoint past the reported end is rebuilt rather than
    /// checked by reading the record before it (some brokers, Tansu, report the end short of the
    /// last record batch; what a read_committed reader sees past that end is untested there).
    static func start(
        checkpoint: Int64?, readAgainFrom: Int64?, low: Int64, high: Int64, rebuildsPastEnd: Bool
    ) -> Start {
        guard let checkpoint else { return .rebuild(reason: nil) }
        if checkpoint - 1 < low || (rebuildsPastEnd && checkpoint > high) {
            return .rebuild(
                reason:
                    "is at offset \(checkpoint), outside the changelog's \(low)..<\(high) (the topic was deleted, truncated or compacted)"
            )
        }
        // Below the changelog's start nothing is left to read again; at the record before the
        // checkpoint, the read from the checkpoint reads it anyway.
        guard let stored = readAgainFrom, max(stored, low) < checkpoint - 1 else { return .checkpoint }
        let from = max(stored, low)
        guard checkpoint - from <= readAgainLimit else {
            return .rebuild(
                reason:
                    "may lack records between offset \(stored), where an earlier restore read it to a committed end, and its checkpoint \(checkpoint): more than \(readAgainLimit) records to read again"
            )
        }
        return .readAgain(from: from)
    }

    /// What a read from the checkpoint (or from below it) tells of a partition's store.
    enum Verdict: Equatable {
        /// The store holds the changelog up to its checkpoint, and the read applied what follows.
        case trusted
        /// Read again from below the checkpoint and held (an open transaction) before the
        /// checkpoint's record: the store is kept, but only part of what was read again could be
        /// applied (``settled(_:heldKeys:)``), and the next restore reads again from the same offset.
        case heldBeforeCheckpoint
        /// Not this store's changelog (created again or truncated): rebuilt.
        case foreign
    }

    /// The verdict on a partition read with `checkpoint` (offset > 0): `readAgain`, whether the read
    /// began below it; `recordBefore`, whether the record before the checkpoint was read and is
    /// (`true`) or is not (`false`) the one the checkpoint names, or was never read (`nil`);
    /// `heldBeforeStart`, whether the read was held before its first offset; `committedEnd`, where
    /// the read settled short of the partition's end (nil: it read to the end).
    static func verdict(
        checkpoint: Int64, readAgain: Bool, recordBefore: Bool?, heldBeforeStart: Bool, committedEnd: Int64?
    ) -> Verdict {
        switch recordBefore {
        case true?: return .trusted
        case false?: return .foreign
        case nil:
            // The record before the checkpoint never came. A committed end the read settled for, at
            // or below it (exactly-once: a transaction left open began before the checkpoint), keeps
            // it out of a read_committed reader's reach: the store holds only what committed
            // transactions wrote, and is kept (a rebuild would read less). Otherwise it was
            // compacted away or aborted: the store is not vouched for.
            let outOfReach = heldBeforeStart || (committedEnd.map { $0 < checkpoint } ?? false)
            guard outOfReach else { return .foreign }
            return readAgain ? .heldBeforeCheckpoint : .trusted
        }
    }

    /// Of the records read again below the checkpoint of a read held before the checkpoint's
    /// record, those that can be applied: the ones whose key has no record in the held range
    /// (`heldKeys`, read without isolation). Each is then its key's latest record below the
    /// checkpoint, whatever the held records become; the others may be older than what the store
    /// holds past the committed end, and wait for a read past the checkpoint.
    static func settled<Record>(
        _ readAgain: [Record], heldKeys: Set<StateStore.HashedBytes>, key: (Record) -> [UInt8]?
    ) -> [Record] {
        readAgain.filter { !heldKeys.contains(StateStore.HashedBytes(key($0) ?? [])) }
    }

    /// What a restore writes as the offset the next one reads again from.
    enum ReadAgainChange: Equatable {
        case unchanged
        case set(Int64)
        case remove
    }

    /// After a restore: `stored`, the offset the store holds now (none once a rebuild reset it);
    /// `verdict`, the read's (nil: rebuilt); `committedEnd`, where the read settled short of the
    /// end (nil: it read to the end).
    ///
    /// A read that settled for a committed end leaves it as the offset: this instance's writes
    /// will move the checkpoint past what others committed beyond it. A read held again before
    /// the checkpoint leaves the offset where it was (what it applied was only the keys with
    /// nothing held). A read to the end removes it.
    static func readAgainAfter(stored: Int64?, verdict: Verdict?, committedEnd: Int64?) -> ReadAgainChange {
        let next = verdict == .heldBeforeCheckpoint ? stored : committedEnd
        guard next != stored else { return .unchanged }
        return next.map { .set($0) } ?? .remove
    }
}
