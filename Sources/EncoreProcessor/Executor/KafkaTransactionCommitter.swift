import Kafka

/// Commits the transaction in progress with consumer offsets and the group's metadata, then
/// begins the next one.
struct KafkaTransactionCommitter: TransactionCommitter {
    let producer: KafkaProducer
    let consumer: KafkaConsumer
    /// How long an abort may take (the drain timeout: it runs at shutdown).
    let abortTimeout: Duration
    /// Told when a transaction committed (true) or aborted: the state store takes its changelog
    /// records only once committed.
    var ended: @Sendable (Bool) -> Void = { _ in }

    func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        if !offsets.isEmpty {
            guard let metadata = consumer.groupMetadata() else {
                throw KafkaError(code: .invalidConfiguration, message: "the consumer has no group metadata")
            }
            try await producer.sendOffsetsToTransaction(offsets, groupMetadata: metadata)
        }
        try await producer.commitTransaction()
        ended(true)
        try producer.beginTransaction()
    }

    func abort() async throws(KafkaError) {
        ended(false)
        try await producer.abortTransaction(timeout: abortTimeout)
    }
}
