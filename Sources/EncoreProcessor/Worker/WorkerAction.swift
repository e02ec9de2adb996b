import Kafka

/// What a ``Worker`` decides and its ``WorkerExecutor`` carries out, in the order decided.
/// Whatever an action's effect returns reaches the worker again as a ``ProcessorInput``.
enum WorkerAction {
    /// Calls the controller: attempt `attempt` of call `call`. Its answer comes back as
    /// ``ProcessorInput/attemptFinished(call:attempt:_:duration:)``.
    case call(Int, attempt: Int, PurchaseRequest, any PurchaseController)
    /// Cancels the running attempt of a call (it still answers, cancelled or not).
    case cancelCall(Int)
    /// Encodes and produces outputs in order, with their tokens; answers come back as
    /// ``ProcessorInput/delivered(_:)``.
    case produce([(token: UInt, output: UnsentOutput)])
    /// Stops fetching the partitions.
    case pause([KafkaTopicPartition])
    /// Commits the offsets (the group's, at least once); ends with
    /// ``ProcessorInput/commitFinished(landed:failed:)``.
    case commit([(InputPartition, KafkaTopicPartitionOffset)])
    /// Exactly-once: commits the transaction in progress with `offsets` and begins the next; ends
    /// with ``ProcessorInput/transactionFinished(landed:error:)``.
    case commitTransaction(offsets: [KafkaTopicPartitionOffset], landed: [InputPartition: KafkaTopicPartitionOffset])
    /// Gives revoked partitions up, committing `offsets`; a refused commit, when `atRisk` records
    /// finished since the last accepted one would be redone, comes back as
    /// ``ProcessorInput/handOverCommitRefused(records:)``.
    case handOver(PartitionHandOver, offsets: [KafkaTopicPartitionOffset], atRisk: Int)
    /// Records done with: the consumer may hand out as many more (``KafkaAdmission``).
    case release(Int)
    /// Publishes the worker's statistics (``Worker/statistics``) to `/metrics` and the health.
    case publishStatistics
    case log(Logger.Level, String, fields: [(String, String)])
}
