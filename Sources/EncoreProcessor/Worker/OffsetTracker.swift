/// Tracks which offsets of each partition are finished and yields the offset that is safe to
/// commit: one past the end of the contiguous finished prefix.
///
/// Records finish out of order (different users run in parallel); a committed offset must never
/// cover a record whose outputs the broker has not acknowledged.
struct OffsetTracker<Partition: Hashable> {
    private struct PartitionState {
        var pending = FIFO<Int64>()
        var finished = Set<Int64>()
        var lastReceived: Int64 = -1
        var firstReceived: Int64 = -1

        var unfinishedCount: Int { pending.count - finished.count }

        /// Returns how many unfinished records were forgotten because the partition was rewound.
        mutating func received(_ offset: Int64) -> Int {
            var forgotten = 0
            if offset <= lastReceived {
                // Rewound (reassigned, or reset): earlier bookkeeping no longer applies.
                forgotten = unfinishedCount
                self = PartitionState()
            }
            if firstReceived < 0 { firstReceived = offset }
            pending.append(offset)
            lastReceived = offset
            return forgotten
        }

        mutating func finished(_ offset: Int64) -> Int64? {
            guard pending.first == offset else {
                finished.insert(offset)
                return nil
            }
            _ = pending.popFirst()
            var advancedTo = offset + 1
            while let next = pending.first, finished.remove(next) != nil {
                _ = pending.popFirst()
                advancedTo = next + 1
            }
            return advancedTo
        }
    }

    private var partitions: [Partition: PartitionState] = [:]

    /// Records not yet finished, across partitions.
    private(set) var pendingCount = 0

    /// A record at `offset` was received; offsets of one partition arrive in increasing order.
    mutating func received(_ partition: Partition, offset: Int64) {
        // Mutated in place: a copy of the state would copy its collections on every record.
        let rewound = partitions[partition, default: PartitionState()].received(offset)
        pendingCount += 1 - rewound
    }

    /// The record at `offset` is finished; returns the new commit offset if the prefix advanced.
    mutating func finished(_ partition: Partition, offset: Int64) -> Int64? {
        // (Through the index and the modify accessor: a getter copies the state, ``inPlace(_:_:)``.)
        guard let index = partitions.index(forKey: partition) else { return nil }
        pendingCount -= 1
        return partitions.values[index].finished(offset)
    }

    /// Where `partition` may be committed: the first unfinished offset (one past the last record
    /// when all are finished) and the offsets above it already finished; `nil` before any record.
    func commitPosition(_ partition: Partition) -> (next: Int64, finishedAbove: Set<Int64>)? {
        guard let state = partitions[partition], state.lastReceived >= 0 else { return nil }
        return (state.pending.first ?? state.lastReceived + 1, state.finished)
    }

    /// The first offset of `partition` received since it was assigned (or rewound).
    func firstReceived(_ partition: Partition) -> Int64? {
        guard let state = partitions[partition], state.firstReceived >= 0 else { return nil }
        return state.firstReceived
    }

    /// Whether `offset` of `partition` was received already (librdkafka may hand a record out
    /// again around a pause and resume).
    mutating func hasReceived(_ partition: Partition, offset: Int64) -> Bool {
        // (Read in place, ``inPlace(_:_:)``: asked for every record.)
        guard let index = partitions.index(forKey: partition) else { return false }
        return inPlace(&partitions.values[index]) { offset <= $0.lastReceived }
    }

    /// Records of `partition` received and not finished.
    func pendingCount(of partition: Partition) -> Int {
        partitions[partition]?.unfinishedCount ?? 0
    }

    /// Forgets `partition` (revoked); its unfinished records will be read again by its next owner.
    mutating func remove(_ partition: Partition) {
        if let state = partitions.removeValue(forKey: partition) {
            pendingCount -= state.unfinishedCount
        }
    }
}
