import EncoreEvents
import Kafka

extension PurchaseProcessor {
    /// Reads the consumer's events and hands them to the dispatch loops: records split by partition
    /// and decoded, assignments with what the previous owner finished and the users' ledger state
    /// (read before any record of those partitions), revocations shared out among the loops.
    static func forward(
        from consumer: KafkaConsumer, to inboxes: [Inbox<ProcessorInput>], configuration: ProcessorConfiguration,
        store: StateStoreWriter?, vitals: ProcessorVitals, logger: Logger
    ) async {
        let router = WorkerRouter(count: inboxes.count)
        // Decoding happens here, beside the loops rather than on them.
        for await event in consumer.events {
            switch event {
            case .messages(let messages):
                for (worker, part) in router.split(messages, by: { $0.partition }) {
                    inboxes[worker].post(
                        .records(
                            part.map { IncomingRecord(message: $0, isSource: $0.topic == configuration.sourcesTopic) }
                        ))
                }
            case .partitionsAssigned(let partitions):
                vitals.update { $0.assignments += 1 }
                // Read before any record of these partitions: what the previous owner finished,
                // and the ledger state of their users.
                let (finished, committed) = await Self.finishedOffsets(
                    of: partitions, configuration: configuration, consumer: consumer, logger: logger)
                var restored: [Int32: RestoredPartition] = [:]
                store?.assigned(partitions.filter { $0.topic == configuration.requestsTopic }.map(\.partition))
                // The users' state and request journals, before any of their records is handled.
                vitals.update { $0.restoring += 1 }
                defer { vitals.update { $0.restoring -= 1 } }
                let started = ContinuousClock.now
                do throws(ProcessorError) {
                    restored = try await Self.restoreLedger(
                        of: partitions.filter { $0.topic == configuration.requestsTopic }.map(\.partition),
                        configuration: configuration, store: store, vitals: vitals, logger: logger)
                    let seconds = Double((ContinuousClock.now - started).wholeMicroseconds) / 1_000_000
                    let users = restored.values.reduce(0) { $0 + $1.states.count }
                    vitals.update {
                        $0.joined = true
                        $0.restores += 1
                        $0.restoredUsers += users
                        $0.restoreSeconds += seconds
                    }
                } catch {
                    // Processing without the users' state would overwrite it: stop instead.
                    for inbox in inboxes { inbox.post(.failed(error)) }
                    continue
                }
                for (worker, part) in router.split(partitions, by: \.partition) {
                    let numbers = Set(part.map(\.partition))
                    inboxes[worker].post(
                        .assigned(
                            part, finished: finished.filter { numbers.contains($0.key.number) },
                            restored: restored.filter { numbers.contains($0.key) },
                            committed: committed.filter { numbers.contains($0.key.number) }))
                }
            case .partitionsRevoked(let partitions, let revocation):
                vitals.update { $0.revocations += 1 }
                // Each worker hands over its share; the partitions go once all have.
                store?.revoked(partitions.filter { $0.topic == configuration.requestsTopic }.map(\.partition))
                let shares = router.split(partitions, by: \.partition)
                let handOver = RevocationHandOver(revocation, parts: shares.count)
                for (worker, part) in shares {
                    inboxes[worker].post(.revoked(part, { handOver.acknowledge(committing: $0, committed: $1) }))
                }
            case .error(let error):
                for inbox in inboxes where error.isFatal { inbox.post(.consumerFailed(error)) }
            case .endOfPartition:
                break  // not asked for
            }
        }
        for inbox in inboxes { inbox.post(.consumerEnded) }
    }
}
