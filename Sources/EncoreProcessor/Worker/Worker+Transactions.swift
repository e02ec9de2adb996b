import Kafka

/// A revocation waiting for the transaction that carries its offsets.
typealias TransactionHandOver = (
    revocation: PartitionOwnership<PartitionHandOver>.Revocation, offsets: [KafkaTopicPartitionOffset]
)

extension Worker {
    /// Exactly-once: a commit starts when ``TransactionProtocol`` says one is due and every output
    /// of the transaction is answered.
    mutating func transactionTick(now: ContinuousClock.Instant, force: Bool = false) {
        guard transactions != nil, !transactionCommitInFlight, failure == nil else { return }
        let offsetsChanged = ownership.generations.keys.contains { partition in
            commitOffsets(for: [partition]).first.map { landed[partition] != $0 } ?? false
        }
        transactions?.tick(isDue: now >= nextCommit, offsetsChanged: offsetsChanged, force: force)
        commitTransactionIfAnswered()
    }

    /// Commits the transaction once the protocol says so: due, and everything produced answered.
    mutating func commitTransactionIfAnswered() {
        guard !transactionCommitInFlight, failure == nil, let handingOver = transactions?.startCommit()
        else { return }
        nextCommit = now.advanced(by: configuration.commitInterval)
        // Every owned partition's offset, changed or not (revoked ones too until handed over): the
        // broker checks the group generation with them, so a zombie member cannot commit. A
        // partition with nothing read yet sends the commit it was assigned with (the same again),
        // so that a worker whose partitions are idle still commits its expiries fenced.
        let changed = ownership.generations.keys.sorted().compactMap { partition in
            (commitOffsets(for: [partition]).first ?? assignedWith[partition]).map { (partition, $0) }
        }
        let offsets = changed.map(\.1) + handingOver.flatMap(\.offsets)
        transactionCommitInFlight = true
        emit(.commitTransaction(offsets: offsets, landed: Dictionary(changed, uniquingKeysWith: { $1 })))
        statistics.transactions += 1
    }

    /// The transaction ended: calls whose intents it held start, revocations are handed over, and
    /// the outputs waiting for the next transaction go out.
    mutating func transactionFinished(landed accepted: [InputPartition: KafkaTopicPartitionOffset], error: KafkaError?)
    {
        transactionCommitInFlight = false
        guard let (items, handingOver) = transactions?.commitEnded() else { return }
        if let error {
            fail(transactionError(error))
            for item in items {
                // A retry or ask journaling in the call table leaves it; a first call never entered it.
                if let (id, _) = item.journalingCall {
                    item.journalingCall = nil
                    if let action = calls.intentLost(id) { perform(action) }
                } else {
                    perform(.abandon(item))
                }
            }
            for handOver in handingOver { emit(.handOver(handOver.revocation.handOver, offsets: [], atRisk: 0)) }
            return
        }
        for (partition, offset) in accepted where ownership.generations[partition] != nil {
            landed[partition] = offset
        }
        for item in items { intentDurable(item) }
        // The offsets were committed in the transaction: the consumer commits nothing.
        for handOver in handingOver { emit(.handOver(handOver.revocation.handOver, offsets: [], atRisk: 0)) }
        // The shutdown's last transaction: nothing is left to produce.
        if ownership.isDraining && calls.isEmpty && outputs.isIdle { transactions?.close() }
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

    /// The loop ended: whether the transaction it left open (after a failure, a failed commit or
    /// a drain that timed out) is to be aborted, so that `read_committed` readers of its
    /// partitions do not wait `transaction.timeout.ms` for it. What it held is redone by the next
    /// owner: none of its offsets committed. `commit`: how a commit in flight when the loop ended
    /// returned (`.some(nil)`: committed), `nil` when none was.
    mutating func endTransaction(commit: KafkaError??) -> Bool {
        guard let state = transactions, !state.isClosed else { return false }
        transactions?.close()
        if let commit {
            // Committed, and the next transaction begun: empty, since outputs wait while a
            // transaction commits.
            guard let error = commit else { return false }
            fail(transactionError(error))
        }
        // The process must exit at once (the call runs on): the transaction is left to the timeout.
        return failure?.code != .callStuck
    }

    /// The transaction left open was aborted (``endTransaction(commit:)``).
    mutating func transactionAborted() {
        statistics.abortedTransactions += 1
        log(.warning, "aborted the open transaction: its records are processed again by their next owner")
    }
}
