import Kafka

/// Commits the transaction in progress with the group's offsets and begins the next one, or aborts
/// it. ``PurchaseProcessor`` provides it over its transactional producer and its consumer.
protocol TransactionCommitter: Sendable {
    func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
    /// Aborts the transaction in progress (a failed commit's too), discarding what it holds.
    func abort() async throws(KafkaError)
}

/// Exactly-once mode: what the loop produces goes into one Kafka transaction at a time, committed
/// with the consumer offsets of the records whose outputs it holds.
///
/// A call starts only once the transaction holding its intent committed, so an aborted
/// transaction can only erase intents of calls never made, and every state an intent's record
/// carries is committed too. While a transaction commits, new outputs wait (they belong to the
/// next one). A failed delivery or commit stops the processor: a transaction that cannot commit
/// takes other records' outputs with it, so the restart redoes everything uncommitted.
struct TransactionState {
    enum Phase { case open, committing }
    var phase = Phase.open
    /// Outputs handed to the producer in this transaction and not yet answered.
    var unanswered = 0
    /// Whether anything was produced in this transaction.
    var produced = false
    /// Items whose intents this transaction holds: their calls start when it commits.
    var intents: [WorkItem] = []
    /// Items of the transaction being committed.
    var committing: [WorkItem] = []
    /// Revocations whose offsets go into the next commit; handed over once it committed.
    var handOvers: [(PartitionOwnership<PartitionHandOver>.Revocation, [KafkaTopicPartitionOffset])] = []
    var handingOver: [(PartitionOwnership<PartitionHandOver>.Revocation, [KafkaTopicPartitionOffset])] = []
    /// The final transaction (shutdown) committed, or the loop ended and its transaction was
    /// aborted (or found committed): nothing more is produced.
    var isClosed = false
    /// The commit in flight, with its error: read when the loop ends before handling its end.
    var commit: Task<KafkaError?, Never>? = nil
}

extension ProcessorLoop {
    /// Starts committing when a commit is due (the interval passed, intents wait for it, or a
    /// hand-over needs its offsets) and nothing is committing; the commit itself starts once every
    /// output of the transaction is answered.
    func transactionTick(now: ContinuousClock.Instant, force: Bool = false) {
        guard var state = transactions, state.phase == .open, !state.isClosed, commitTask == nil, failure == nil
        else { return }
        let due = now >= nextCommit || !state.intents.isEmpty || !state.handOvers.isEmpty || force
        let offsetsChanged = ownership.generations.keys.contains { partition in
            commitOffsets(for: [partition]).first.map { landed[partition] != $0 } ?? false
        }
        guard due, state.produced || offsetsChanged || !state.handOvers.isEmpty || force else { return }
        state.phase = .committing
        transactions = state
        commitTransactionIfAnswered()
    }

    /// Commits once everything produced in the transaction has been answered.
    func commitTransactionIfAnswered() {
        guard var state = transactions, state.phase == .committing, state.unanswered == 0, commitTask == nil,
            failure == nil, let committer
        else { return }
        nextCommit = clock.now.advanced(by: configuration.commitInterval)
        // Every owned partition's offset, changed or not (revoked ones too until handed over): the
        // broker checks the group generation with them, so a zombie member cannot commit. A
        // partition with nothing read yet sends the commit it was assigned with (the same again),
        // so that a worker whose partitions are idle still commits its expiries fenced.
        let changed = ownership.generations.keys.sorted().compactMap { partition in
            (commitOffsets(for: [partition]).first ?? assignedWith[partition]).map { (partition, $0) }
        }
        state.handingOver = state.handOvers
        state.handOvers = []
        state.committing = state.intents
        state.intents = []
        let offsets = changed.map(\.1) + state.handingOver.flatMap(\.1)
        let inbox = self.inbox
        let commit = Task { () -> KafkaError? in
            do throws(KafkaError) {
                try await committer.commit(offsets: offsets)
                inbox.post(.transactionFinished(landed: Dictionary(changed, uniquingKeysWith: { $1 }), error: nil))
                return nil
            } catch {
                inbox.post(.transactionFinished(landed: [:], error: error))
                return error
            }
        }
        state.commit = commit
        transactions = state
        commitTask = Task { _ = await commit.value }
        statistics.transactions += 1
    }

    /// The transaction ended: calls whose intents it held start, revocations are handed over, and
    /// the outputs waiting for the next transaction go out.
    func transactionFinished(landed accepted: [InputPartition: KafkaTopicPartitionOffset], error: KafkaError?) {
        commitTask = nil
        guard var state = transactions else { return }
        state.commit = nil
        let (items, handingOver) = (state.committing, state.handingOver)
        state.committing = []
        state.handingOver = []
        state.phase = .open
        state.produced = false
        transactions = state
        if let error {
            fail(transactionError(error))
            for item in items {
                // A retry or ask journaling in the call table leaves it; a first call never entered it.
                if let (id, _) = item.journalingCall {
                    item.journalingCall = nil
                    calls.intentLost(id).map(perform)
                } else {
                    perform(.abandon(item))
                }
            }
            for (revocation, _) in handingOver { revocation.handOver([]) { _ in } }
            return
        }
        for (partition, offset) in accepted where ownership.generations[partition] != nil {
            landed[partition] = offset
        }
        for item in items { intentDurable(item) }
        // The offsets were committed in the transaction: the consumer commits nothing.
        for (revocation, _) in handingOver { revocation.handOver([]) { _ in } }
        // The shutdown's last transaction: nothing is left to produce.
        if ownership.isDraining && calls.isEmpty && outputs.isIdle { transactions?.isClosed = true }
    }

    /// Why a transaction cannot commit; fenced, that another live producer has this instance's
    /// `transactional.id`: two instances given one `--instance-id` would fence each other in a loop.
    func transactionError(_ error: KafkaError) -> ProcessorError {
        guard error.isFencing else { return ProcessorError(.outputLost, "the transaction cannot commit: \(error)") }
        return ProcessorError(
            .fenced,
            "the transaction cannot commit: another producer took this instance's transactional.id (\(error)); if another live instance runs with --instance-id \(configuration.instanceID), give each instance its own (two instances with one id fence each other in a loop)"
        )
    }

    /// Called once the loop ended: a transaction the loop did not close (after a failure, a failed
    /// commit or a drain that timed out) is aborted, so that `read_committed` readers of its
    /// partitions do not wait `transaction.timeout.ms` for it. What it held is redone by the next
    /// owner: none of its offsets committed.
    func abortOpenTransaction() async {
        guard let committer, let state = transactions, !state.isClosed else { return }
        transactions?.isClosed = true
        // A commit still in flight when the loop ended reports to an inbox no one reads any more.
        if let commit = state.commit {
            if let error = await commit.value {
                fail(transactionError(error))
            } else {
                // Committed, and the next transaction begun: empty, since outputs wait while a
                // transaction commits.
                return
            }
        }
        // The process must exit at once (the call runs on): the transaction is left to the timeout.
        guard failure?.code != .callStuck else { return }
        do {
            try await committer.abort()
            statistics.abortedTransactions += 1
            logger.warning("aborted the open transaction: its records are processed again by their next owner")
        } catch {
            logger.error(
                "cannot abort the open transaction (\(error)): read_committed readers wait for it up to transaction.timeout.ms"
            )
        }
        recorder.publish(statistics)
    }
}
