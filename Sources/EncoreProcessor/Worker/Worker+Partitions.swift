import EncoreEvents
import Kafka

/// The worker's partitions: assignment, commits of the finished prefix, revocation and hand-over.
extension Worker {
    /// The record's work is complete: advance the committable offset of its partition.
    mutating func finish(_ ref: RecordRef) {
        statistics.finished += 1
        statistics.lastFinishedAtMs = nowMs
        released += 1
        guard ownership.owns(ref) else { return }
        _ = tracker.finished(ref.partition, offset: ref.offset)
    }

    /// The offsets to commit for `partitions`, with the finished offsets beyond them as metadata.
    func commitOffsets(for partitions: some Sequence<InputPartition>) -> [KafkaTopicPartitionOffset] {
        partitions.sorted().compactMap { partition in
            guard let position = tracker.commitPosition(partition) else { return nil }
            return KafkaTopicPartitionOffset(
                topic: topicName(partition.topic), partition: partition.number, offset: position.next,
                metadata: FinishedOffsets.encode(committed: position.next, finished: position.finishedAbove))
        }
    }

    /// Every owned partition's commit position: what shutdown commits last.
    var finalCommitOffsets: [KafkaTopicPartitionOffset] { commitOffsets(for: ownership.generations.keys) }

    mutating func commitIfDue(now: ContinuousClock.Instant) {
        guard now >= nextCommit, !commitInFlight else { return }
        nextCommit = now.advanced(by: configuration.commitInterval)
        // Only what changed since the last commit the broker accepted.
        let changed = ownership.assigned.sorted().compactMap { partition in
            commitOffsets(for: [partition]).first.flatMap { landed[partition] == $0 ? nil : (partition, $0) }
        }
        guard !changed.isEmpty else { return }
        commitInFlight = true
        emit(.commit(changed))
    }

    /// Records of `partition` finished in this assignment that the last commit the broker accepted
    /// does not cover: what the next owner redoes if the hand-over's commit is refused.
    func finishedBeyondLanded(_ partition: InputPartition) -> Int {
        guard let position = tracker.commitPosition(partition), let first = tracker.firstReceived(partition) else {
            return 0
        }
        let covered: (Int64) -> Bool
        if let landed = landed[partition] {
            let above = FinishedOffsets.decode(landed.metadata, committed: landed.offset)
            covered = { $0 < landed.offset || above.contains($0) }
        } else {
            // The assignment's commit: where reading started, and what it listed as finished beyond.
            let above = assignedCommit[partition] ?? []
            covered = { $0 < first || above.contains($0) }
        }
        let prefix = (first..<max(first, position.next)).reduce(0) { $0 + (covered($1) ? 0 : 1) }
        return prefix + position.finishedAbove.reduce(0) { $0 + (covered($1) ? 0 : 1) }
    }

    func topicName(_ topic: InputPartition.Topic) -> String {
        switch topic {
        case .requests: configuration.requestsTopic
        case .sources: configuration.sourcesTopic ?? ""
        }
    }

    mutating func pause(_ inputs: some Collection<InputPartition>) {
        emit(.pause(inputs.sorted().map { KafkaTopicPartition(topic: topicName($0.topic), partition: $0.number) }))
    }

    mutating func assign(_ assignment: [KafkaTopicPartition]) {
        let partitions = assignment.compactMap { InputPartition.of($0.topic, $0.partition, in: configuration) }
        // A partition still owned keeps its generation and what it has received.
        for partition in partitions where ownership.generations[partition] == nil { tracker.remove(partition) }
        ownership.assign(partitions)
        if ownership.isDraining { pause(partitions) }
    }

    mutating func revoke(_ partitions: [KafkaTopicPartition], _ handOver: @escaping PartitionHandOver) {
        let leaving = Set(
            ownership.revoke(
                partitions.compactMap { InputPartition.of($0.topic, $0.partition, in: configuration) },
                handOver: handOver,
                now: now,
                timeout: configuration.drainTimeout))
        // Work not started stays unprocessed: the next owner reads it again.
        let dropped = scheduler.removeWaiting { leaving.contains($0.ref.partition) }
        released += dropped.count
        if !dropped.isEmpty { log(.info, "revoked: \(dropped.count) queued requests left to the next owner") }
        abandonWaitingForIntent { leaving.contains($0) }
        for action in calls.handOver(where: leaving.contains, by: now.advanced(by: configuration.drainTimeout)) {
            perform(action)
        }
        abandonWaitingForSlot { leaving.contains($0) }
    }

    /// New requests of leaving partitions whose intent is not out yet are left to the next owner
    /// (nothing is journaled: it reads them again as new). Before anything frees a call slot or a
    /// place ahead (a hand-over's abandoned calls do): a freed place would publish one's intent.
    mutating func abandonWaitingForIntent(of isLeaving: (InputPartition) -> Bool) {
        guard !waitingForIntent.isEmpty else { return }
        var kept = FIFO<WorkItem>()
        var leaving: [WorkItem] = []
        while let item = waitingForIntent.popFirst() {
            if isLeaving(item.ref.partition) { leaving.append(item) } else { kept.append(item) }
        }
        // (Set before abandoning: an abandon frees places, which go to the kept ones only.)
        waitingForIntent = kept
        for item in leaving { perform(.abandon(item)) }
    }

    /// Items of leaving partitions that wait for a call slot are left to the next owner (their
    /// intent is durable: it calls them as recoveries) rather than holding the hand-over.
    mutating func abandonWaitingForSlot(of isLeaving: (InputPartition) -> Bool) {
        guard !waitingForSlot.isEmpty else { return }
        var kept = FIFO<WorkItem>()
        while let item = waitingForSlot.popFirst() {
            if isLeaving(item.ref.partition) { perform(.abandon(item)) } else { kept.append(item) }
        }
        waitingForSlot = kept
    }

    /// Completes the revocations whose partitions have nothing in work; reports overdue ones and
    /// cancels their calls (then waits for them: a partition is never handed over with a call alive).
    mutating func pollOwnership() {
        // A periodic commit still in flight could land after the hand-over's and set offsets back;
        // ledger updates of no record (expiries) must reach the changelog before the next owner reads it.
        let actions: [PartitionOwnership<PartitionHandOver>.Action]
        do {
            // (A copy, ended before the actions change the outputs: the closure may not read self.)
            let committing = commitInFlight || transactionCommitInFlight
            let outputs = self.outputs
            actions = ownership.poll(now: now) { partition in
                committing || (partition.topic == .requests && outputs.hasUpdates(ofPartition: partition.number))
            }
        }
        for action in actions {
            switch action {
            case .handOver(let revocation):
                handOver(revocation)
            case .overdue(let partitions, let inWork):
                log(
                    .error,
                    "hand-over of partitions \(partitions.sorted()) is overdue: \(inWork) records still in work; cancelling their calls and waiting for them to return (the partitions are not released while a call runs)"
                )
                let leaving = Set(partitions)
                for action in calls.interrupt(where: leaving.contains) { perform(action) }
            case .stuck(let partitions, let inWork):
                stop(
                    stuck:
                        "a call of partitions \(partitions.sorted()) ignored cancellation (\(inWork) records in work)")
            }
        }
    }

    mutating func handOver(_ revocation: PartitionOwnership<PartitionHandOver>.Revocation) {
        // The consumer commits these, finished offsets included, before letting the partitions go.
        let offsets = commitOffsets(for: revocation.partitions)
        let atRisk = revocation.partitions.reduce(0) { $0 + finishedBeyondLanded($1) }
        for partition in revocation.partitions {
            tracker.remove(partition)
            skipFinished[partition] = nil
            assignedCommit[partition] = nil
            assignedWith[partition] = nil
            landed[partition] = nil
        }
        if logsDebug {
            log(
                .debug,
                "revoked \(revocation.partitions.count) partitions; committing \(offsets.map { "\($0.partition)@\($0.offset)" })"
            )
        }
        // The next owner restores these users from the changelog.
        ledger.remove(partitions: Set(revocation.partitions.filter { $0.topic == .requests }.map(\.number)))
        if let state = transactions {
            // Exactly-once: the offsets go into the next transaction (the last one held them all).
            if state.isClosed {
                emit(.handOver(revocation.handOver, offsets: [], atRisk: 0))
            } else {
                transactions?.hold(handOver: (revocation, offsets))
                transactionTick(now: now)
            }
            return
        }
        // A refused commit is reported back (``ProcessorInput/handOverCommitRefused(records:)``).
        emit(.handOver(revocation.handOver, offsets: offsets, atRisk: atRisk))
    }
}
