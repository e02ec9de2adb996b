import Kafka

/// Commits the transaction in progress with the group's offsets and begins the next one, or aborts
/// it. ``PurchaseProcessor`` provides it over its transactional producer and its consumer.
protocol TransactionCommitter: Sendable {
    func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
    /// Aborts the transaction in progress (a failed commit's too), discarding what it holds.
    func abort() async throws(KafkaError)
}

/// A revocation waiting for the transaction that carries its offsets.
typealias TransactionHandOver = (
    revocation: PartitionOwnership<PartitionHandOver>.Revocation, offsets: [KafkaTopicPartitionOffset]
)

extension ProcessorLoop {
    /// Exactly-once: a commit starts when ``TransactionProtocol`` says one is due and every output
    /// of the transaction is answered.
    func transactionTick(now: ContinuousClock.Instant, force: Bool = false) {
        guard transactions != nil, transactionCommit == nil, failure == nil else { return }
        let offsetsChanged = ownership.generations.keys.contains { partition in
            commitOffsets(for: [partition]).first.map { landed[partition] != $0 } ?? false
        }
        transactions?.tick(isDue: now >= nextCommit, offsetsChanged: offsetsChanged, force: force)
        commitTransactionIfAnswered()
    }

    /// Commits the transaction once the protocol says so: due, and everything produced answered.
    func commitTransactionIfAnswered() {
        guard transactionCommit == nil, failure == nil, let committer,
            let handingOver = transactions?.startCommit()
        else { return }
        nextCommit = clock.now.advanced(by: configuration.commitInterval)
        // Every owned partition's offset, changed or not (revoked ones too until handed over): the
        // broker checks the group generation with them, so a zombie member cannot commit. A
        // partition with nothing read yet sends the commit it was assigned with (the same again),
        // so that a worker whose partitions are idle still commits its expiries fenced.
        let changed = ownership.generations.keys.sorted().compactMap { partition in
            (commitOffsets(for: [partition]).first ?? assignedWith[partition]).map { (partition, $0) }
        }
        let offsets = changed.map(\.1) + handingOver.flatMap(\.offsets)
        let inbox = self.inbox
        transactionCommit = Task { () -> KafkaError? in
            do throws(KafkaError) {
                try await committer.commit(offsets: offsets)
                inbox.post(.transactionFinished(landed: Dictionary(changed, uniquingKeysWith: { $1 }), error: nil))
                return nil
            } catch {
                inbox.post(.transactionFinished(landed: [:], error: error))
                return error
            }
        }
        statistics.transactions += 1
    }

    /// The transaction ended: calls whose intents it held start, revocations are handed over, and
    /// the outputs waiting for the next transaction go out.
    func transactionFinished(landed accepted: [InputPartition: KafkaTopicPartitionOffset], error: KafkaError?) {
        transactionCommit = nil
        guard let (items, handingOver) = transactions?.commitEnded() else { return }
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
            for handOver in handingOver { handOver.revocation.handOver([]) { _ in } }
            return
        }
        for (partition, offset) in accepted where ownership.generations[partition] != nil {
            landed[partition] = offset
        }
        for item in items { intentDurable(item) }
        // The offsets were committed in the transaction: the consumer commits nothing.
        for handOver in handingOver { handOver.revocation.handOver([]) { _ in } }
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

    /// Called once the loop ended: a transaction the loop did not close (after a failure, a failed
    /// commit or a drain that timed out) is aborted, so that `read_committed` readers of its
    /// partitions do not wait `transaction.timeout.ms` for it. What it held is redone by the next
    /// owner: none of its offsets committed.
    func abortOpenTransaction() async {
        guard let committer, let state = transactions, !state.isClosed else { return }
        transactions?.close()
        // A commit still in flight when the loop ended reports to an inbox no one reads any more.
        if let commit = transactionCommit {
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
