/// Which input partitions a loop owns, under which generation, and when a revoked partition may
/// be handed over.
///
/// Every assignment of a partition gets a new generation; work carries it (``RecordRef``), and a
/// result of a generation no longer owned changes nothing. A revoked partition is handed over only
/// once none of its records is in work (calls returned, outputs acknowledged): past the deadline
/// it is reported overdue (the loop cancels its calls and waits), never released with a call
/// alive. A pure state machine; `HandOver` is what completes a revocation.
struct PartitionOwnership<HandOver> {
    struct Revocation {
        var partitions: [InputPartition]
        var handOver: HandOver
        var deadline: ContinuousClock.Instant
        /// When it was last reported overdue.
        var reportedAt: ContinuousClock.Instant? = nil
    }

    enum Action {
        /// Nothing of these partitions is in work any more: commit and let them go.
        case handOver(Revocation)
        /// The deadline passed with records still in work (reported again every `reportInterval`).
        case overdue([InputPartition], inWork: Int)
        /// Still in work `stuckAfter` past the deadline: the group is about to give the partitions
        /// to another member anyway (`max.poll.interval.ms`), so the processor must stop first.
        case stuck([InputPartition], inWork: Int)
    }

    /// Owned partitions (assigned, or revoked and not yet handed over) and their generation.
    private(set) var generations: [InputPartition: Int] = [:]
    private var lastGeneration = 0
    private var revocations: [Revocation] = []
    /// Records in work per partition: in a call, or with outputs not yet acknowledged.
    private var inWork: [InputPartition: Int] = [:]
    /// Set once shutdown begins: no new records are taken.
    private(set) var drainDeadline: ContinuousClock.Instant? = nil
    let reportInterval: Duration
    let stuckAfter: Duration

    init(reportInterval: Duration = .seconds(10), stuckAfter: Duration = .seconds(55)) {
        self.reportInterval = reportInterval
        self.stuckAfter = stuckAfter
    }

    var isDraining: Bool { drainDeadline != nil }
    var hasRevocations: Bool { !revocations.isEmpty }

    /// Partitions owned and not being revoked.
    var assigned: [InputPartition] { generations.keys.filter { !isRevoking($0) } }

    func isRevoking(_ partition: InputPartition) -> Bool {
        revocations.contains { $0.partitions.contains(partition) }
    }

    /// Partitions newly assigned: each gets a generation never used before. A partition still
    /// owned keeps its generation (its work goes on).
    mutating func assign(_ partitions: [InputPartition]) {
        for partition in partitions where generations[partition] == nil {
            lastGeneration += 1
            generations[partition] = lastGeneration
        }
    }

    /// The generation a new record of `partition` is taken under; `nil` when the partition is not
    /// assigned, is being revoked, or the loop is draining (the record is left to the next owner).
    func generation(forNewRecordOf partition: InputPartition) -> Int? {
        guard !isDraining, let generation = generations[partition], !isRevoking(partition) else { return nil }
        return generation
    }

    /// Whether `ref`'s assignment is still owned: only then may its results change anything.
    func owns(_ ref: RecordRef) -> Bool { generations[ref.partition] == ref.generation }

    /// A record of `ref`'s assignment is in work (a call, or outputs not yet acknowledged).
    mutating func beginWork(_ ref: RecordRef) {
        guard owns(ref) else { return }
        inWork[ref.partition, default: 0] += 1
    }

    /// A record of `ref`'s assignment is no longer in work (done, or left to the next owner).
    mutating func endWork(_ ref: RecordRef) {
        guard owns(ref) else { return }
        let count = (inWork[ref.partition] ?? 1) - 1
        inWork[ref.partition] = count > 0 ? count : nil
    }

    /// The deadline by which work of `partition` must be over, when it is being handed over.
    func deadline(of partition: InputPartition) -> ContinuousClock.Instant? {
        revocations.first { $0.partitions.contains(partition) }?.deadline ?? drainDeadline
    }

    /// Partitions taken away; returns those that were owned.
    mutating func revoke(
        _ partitions: [InputPartition], handOver: HandOver, now: ContinuousClock.Instant, timeout: Duration
    ) -> [InputPartition] {
        let owned = partitions.filter { generations[$0] != nil && !isRevoking($0) }
        revocations.append(Revocation(partitions: owned, handOver: handOver, deadline: now.advanced(by: timeout)))
        return owned
    }

    /// Stops taking records; everything owned must be over by `now + timeout`.
    mutating func beginDrain(now: ContinuousClock.Instant, timeout: Duration) {
        if drainDeadline == nil { drainDeadline = now.advanced(by: timeout) }
    }

    /// Revocations that may complete now, and those overdue. `isHeld` says whether a partition
    /// has other unfinished business (a commit in flight, a changelog write without a record).
    mutating func poll(now: ContinuousClock.Instant, isHeld: (InputPartition) -> Bool) -> [Action] {
        var actions: [Action] = []
        var index = 0
        while index < revocations.count {
            let revocation = revocations[index]
            let working = revocation.partitions.reduce(0) { $0 + (inWork[$1] ?? 0) }
            if working == 0 && !revocation.partitions.contains(where: isHeld) {
                revocations.remove(at: index)
                for partition in revocation.partitions { generations[partition] = nil }
                actions.append(.handOver(revocation))
                continue
            }
            if working > 0, now >= revocation.deadline.advanced(by: stuckAfter) {
                actions.append(.stuck(revocation.partitions, inWork: working))
            } else if working > 0, now >= revocation.deadline,
                revocation.reportedAt.map({ now >= $0.advanced(by: reportInterval) }) ?? true
            {
                revocations[index].reportedAt = now
                actions.append(.overdue(revocation.partitions, inWork: working))
            }
            index += 1
        }
        return actions
    }

    /// Every revocation still waiting (the loop is ending): handed over as they are.
    mutating func takeRevocations() -> [Revocation] {
        defer { revocations = [] }
        for revocation in revocations {
            for partition in revocation.partitions {
                generations[partition] = nil
                inWork[partition] = nil
            }
        }
        return revocations
    }
}
