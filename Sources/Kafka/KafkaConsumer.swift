import CRdKafka
import Foundation
import Synchronization

/// What a ``KafkaConsumer`` reports, in the order it happened.
public enum KafkaConsumerEvent: Sendable {
    /// Records in the order they were fetched (per partition, in offset order): everything
    /// available at once, up to ``KafkaConsumer/maximumBatchSize``.
    case messages([KafkaMessage])
    /// Partitions this member now owns.
    case partitionsAssigned([KafkaTopicPartition])
    /// Partitions being taken away. The consumer waits until ``KafkaRevocation/acknowledge()`` is
    /// called (or the consumer closes), commits the offsets given, then lets the partitions go.
    case partitionsRevoked([KafkaTopicPartition], KafkaRevocation)
    /// A consumer error librdkafka reported (fatal ones end the stream).
    case error(KafkaError)
    /// The consumer reached the end of a partition; `offset` is the next offset to read. Only with
    /// `enable.partition.eof=true`.
    case endOfPartition(KafkaTopicPartition, offset: Int64)
}

/// Lets the application say it has finished with revoked partitions.
public final class KafkaRevocation: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    private let answer = Mutex<(offsets: [KafkaTopicPartitionOffset], committed: (@Sendable (KafkaError?) -> Void)?)>(
        ([], nil))

    init() {}

    /// The application is done with the revoked partitions: commit `offsets` (with their metadata;
    /// empty commits what was stored with ``KafkaConsumer/storeOffsets(_:)``) and release them.
    /// `committed` learns whether the broker took the commit (`nil`) or why not.
    public func acknowledge(
        committing offsets: [KafkaTopicPartitionOffset] = [], committed: (@Sendable (KafkaError?) -> Void)? = nil
    ) {
        answer.withLock { $0 = (offsets, committed) }
        semaphore.signal()
    }

    var offsetsToCommit: [KafkaTopicPartitionOffset] { answer.withLock { $0.offsets } }

    /// Tells the application how the commit of the acknowledged offsets went.
    func reportCommit(_ error: KafkaError?) {
        answer.withLock { $0.committed }?(error)
    }

    func wait(timeout: Duration) -> Bool {
        semaphore.wait(timeout: .now() + .milliseconds(timeout.milliseconds)) == .success
    }
}

/// A consumer-group member that yields records and rebalance events as an `AsyncSequence`.
///
/// librdkafka is polled on a thread of the consumer's own. Offsets are stored explicitly with
/// ``storeOffsets(_:)`` (`enable.auto.offset.store=false`) and committed by librdkafka's periodic
/// auto-commit, on revocation, on close, or explicitly with ``commit()``.
public final class KafkaConsumer: Sendable {
    private let client: RDKafkaClient
    private let poller: Mutex<RDKafkaPollThread?>
    private let sink: EventSink
    private let closing: ClosingFlag
    private let logger: Logger
    private let admission: KafkaAdmission?

    /// Records and rebalance events; one reader.
    public let events: AsyncStream<KafkaConsumerEvent>

    /// The largest number of records in one ``KafkaConsumerEvent/messages(_:)``.
    public static let maximumBatchSize = 1024

    /// Creates a consumer. `configuration` must name `bootstrap.servers` and `group.id`.
    ///
    /// - Parameters:
    ///   - revocationReportInterval: how often a revocation still waiting for
    ///     ``KafkaRevocation/acknowledge()`` is logged. It is never released without it: the
    ///     application may still be working on the partitions (until ``close()``).
    ///   - admission: bounds the records handed out and not yet released (``KafkaAdmission``).
    public init(
        configuration: KafkaConfiguration, revocationReportInterval: Duration = .seconds(30),
        admission: KafkaAdmission? = nil, logger: Logger = Logger(label: "kafka.consumer")
    ) throws(KafkaError) {
        guard configuration.groupID != nil else {
            throw KafkaError(code: .invalidConfiguration, message: "a consumer needs 'group.id'")
        }
        var configuration = configuration
        configuration.setDefault("enable.auto.offset.store", "false")
        configuration.setDefault("enable.auto.commit", "true")
        configuration.setDefault("auto.offset.reset", "earliest")
        configuration.setDefault("enable.partition.eof", "false")
        self.logger = logger
        self.admission = admission
        let (events, continuation) = AsyncStream<KafkaConsumerEvent>.makeStream()
        self.events = events
        let sink = EventSink(continuation)
        self.sink = sink
        let closing = ClosingFlag()
        self.closing = closing
        let callbacks = RDKafkaCallbacks(
            logger: logger,
            onError: { error in if error.isFatal { sink.yield(.error(error)) } },
            onRebalance: { handle, code, list in
                KafkaConsumer.rebalance(
                    handle: handle, code: code, list: list, sink: sink, closing: closing,
                    reportInterval: revocationReportInterval, logger: logger)
            })
        self.client = try RDKafkaClient.make(.consumer, configuration: configuration, callbacks: callbacks)
        rd_kafka_poll_set_consumer(client.handle)
        self.poller = Mutex(nil)
    }

    /// Joins the group and subscribes to `topics`; records start flowing into ``events``.
    public func subscribe(topics: [String]) throws(KafkaError) {
        let list = RDKafkaTopicPartitionList.make(topics.map { KafkaTopicPartition(topic: $0, partition: -1) })
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_subscribe(client.handle, list)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(err, context: "subscribe to \(topics.joined(separator: ","))")
        }
        startPolling()
    }

    /// Reads `partitions` from the given offsets without joining the group (replays, audits).
    /// Offsets may be `-2` (earliest) or `-1` (latest).
    public func assign(_ partitions: [KafkaTopicPartitionOffset]) throws(KafkaError) {
        let list = RDKafkaTopicPartitionList.make(partitions)
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_assign(client.handle, list)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "assign") }
        startPolling()
    }

    private func startPolling() {
        poller.withLock { poller in
            guard poller == nil else { return }
            let (client, sink, admission, logger) = (self.client, self.sink, self.admission, self.logger)
            poller = RDKafkaPollThread(name: "encore.consumer") {
                // Wait for one record, then take what else is ready (as much as the admission has room
                // for), and hand them over together.
                var limit = KafkaConsumer.maximumBatchSize
                if let admission {
                    guard let room = KafkaConsumer.room(in: admission, client: client, sink: sink, logger: logger)
                    else { return }
                    limit = min(limit, room)
                }
                var timeout: Int32 = 100
                var records = 0
                // The batch's records share their topic's name (one `String` a batch, not a record).
                var topic: String? = nil
                for _ in 0..<limit {
                    guard let message = rd_kafka_consumer_poll(client.handle, timeout) else { break }
                    timeout = 0
                    defer { rd_kafka_message_destroy(message) }
                    if KafkaConsumer.handle(message, client: client, sink: sink, topic: &topic) { records += 1 }
                }
                admission?.admit(records)
                sink.flush()
            }
        }
    }

    /// How many records to poll for now (`nil`: none yet); while the buffer is full, waits a little
    /// for room (see ``KafkaAdmission``).
    private static func room(
        in admission: KafkaAdmission, client: RDKafkaClient, sink: EventSink, logger: Logger
    ) -> Int? {
        var decision = admission.decide(slice: .zero)
        if case .wait = decision {
            sink.flush()
            decision = admission.decide(slice: .milliseconds(100))
        }
        switch decision {
        case .poll(let room):
            return room
        case .resumeAndPoll(let partitions, let room):
            pauseOrResume(partitions, pause: false, client: client, logger: logger)
            return room
        case .pauseAndPoll:
            var list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>? = nil
            guard rd_kafka_assignment(client.handle, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return 1 }
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let partitions = RDKafkaTopicPartitionList.entries(list).map(\.topicPartition)
            logger.warning(
                "buffer full for \(admission.stallLimit): pausing \(partitions.count) partitions until records are done"
            )
            pauseOrResume(partitions, pause: true, client: client, logger: logger)
            admission.pausedForRoom(partitions)
            return 1
        case .wait:
            return nil
        }
    }

    private static func pauseOrResume(
        _ partitions: [KafkaTopicPartition], pause: Bool, client: RDKafkaClient, logger: Logger
    ) {
        guard !partitions.isEmpty else { return }
        let list = RDKafkaTopicPartitionList.make(partitions)
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err =
            pause ? rd_kafka_pause_partitions(client.handle, list) : rd_kafka_resume_partitions(client.handle, list)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            logger.warning("cannot \(pause ? "pause" : "resume") partitions: \(KafkaError(err, context: ""))")
        }
    }

    /// Hands the polled message to the sink; `true` when it was a record.
    private static func handle(
        _ message: UnsafeMutablePointer<rd_kafka_message_t>, client: RDKafkaClient, sink: EventSink,
        topic: inout String?
    ) -> Bool {
        switch event(from: message, client: client, topic: &topic) {
        case .message(let record)?:
            sink.append(record)
            return true
        case .error(let error)?:
            sink.yield(.error(error))
            return false
        case .endOfPartition(let partition, let offset)?:
            sink.yield(.endOfPartition(partition, offset: offset))
            return false
        case nil:
            return false
        }
    }

    private enum PolledEvent {
        case message(KafkaMessage)
        case error(KafkaError)
        case endOfPartition(KafkaTopicPartition, offset: Int64)
    }

    /// `topic`: the name of the topic of the batch's records so far, reused when this record's is the same.
    private static func event(
        from message: UnsafeMutablePointer<rd_kafka_message_t>, client: RDKafkaClient, topic cached: inout String?
    ) -> PolledEvent? {
        let m = message.pointee
        let topic = m.rkt.map { topicName(rd_kafka_topic_name($0), reusing: &cached) } ?? "?"
        guard m.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            if m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF {
                return .endOfPartition(KafkaTopicPartition(topic: topic, partition: m.partition), offset: m.offset)
            }
            let error = KafkaError(
                m.err, context: "consume from \(topic)[\(m.partition)]", isFatal: m.err == RD_KAFKA_RESP_ERR__FATAL)
            client.logger.warning("consumer error \(error)")
            return .error(error)
        }
        let value = RDKafkaMessage.value(message)
        let key = RDKafkaMessage.key(message)
        let headers = RDKafkaMessage.headerBuffer(message)
        var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let timestamp = rd_kafka_message_timestamp(message, &timestampType)
        return .message(
            KafkaMessage(
                topic: topic, partition: m.partition, offset: m.offset, key: key, value: value, headerBuffer: headers,
                timestampMs: timestampType == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : timestamp))
    }

    /// The name `name` as a `String`: `cached` itself when it holds the same name, else a new one,
    /// kept in `cached`. A name longer than 15 bytes is an allocation of its own, which a record
    /// would otherwise pay on this thread and free on the worker's.
    static func topicName(_ name: UnsafePointer<CChar>?, reusing cached: inout String?) -> String {
        guard let name else { return "?" }
        if var known = cached {
            let length = strlen(name)
            let same = known.withUTF8 { bytes in
                bytes.count == length && (length == 0 || memcmp(name, bytes.baseAddress!, length) == 0)
            }
            if same { return known }
        }
        let text = String(cString: name)
        cached = text
        return text
    }

    /// Whether a rebalance is cooperative (incremental), from `rd_kafka_rebalance_protocol`'s name,
    /// which is NULL on an error (its group handler cannot answer, as while the consumer closes).
    /// The rebalance is then done eagerly (`rd_kafka_assign`); should librdkafka refuse that, the
    /// refusal is logged.
    static func isCooperative(rebalanceProtocol name: UnsafePointer<CChar>?) -> Bool {
        name.map { String(cString: $0) == "COOPERATIVE" } ?? false
    }

    private static func rebalance(
        handle: OpaquePointer, code: rd_kafka_resp_err_t, list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>,
        sink: EventSink, closing: ClosingFlag, reportInterval: Duration, logger: Logger
    ) {
        let cooperative = isCooperative(rebalanceProtocol: rd_kafka_rebalance_protocol(handle))
        let partitions = RDKafkaTopicPartitionList.entries(list).map(\.topicPartition)
        switch code {
        case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
            logger.info(
                "assigned \(partitions.count) partitions: \(partitions.map(\.description).joined(separator: " "))")
            if cooperative {
                if let error = rd_kafka_incremental_assign(handle, list) {
                    logger.error("\(KafkaError(consuming: error, context: "incremental assign"))")
                }
            } else {
                let err = rd_kafka_assign(handle, list)
                if err != RD_KAFKA_RESP_ERR_NO_ERROR { logger.error("\(KafkaError(err, context: "assign"))") }
            }
            sink.yield(.partitionsAssigned(partitions))
        default:
            logger.info("revoking \(partitions.count) partitions")
            let revocation = KafkaRevocation()
            if case .enqueued = sink.yield(.partitionsRevoked(partitions, revocation)), !closing.isSet {
                // Wait as long as the application works on the partitions (a running purchase must
                // not be handed to another member); only a close ends the wait.
                let every = max(1, reportInterval.components.seconds)
                var waited: Int64 = 0
                while !revocation.wait(timeout: .seconds(1)) {
                    if closing.isSet { break }
                    waited += 1
                    if waited % every == 0 {
                        logger.warning(
                            "revocation of \(partitions.count) partitions still waiting for the application after \(waited) s"
                        )
                    }
                }
            }
            let explicit = revocation.offsetsToCommit
            let offsets = explicit.isEmpty ? nil : RDKafkaTopicPartitionList.make(explicit)
            defer { if let offsets { rd_kafka_topic_partition_list_destroy(offsets) } }
            let err = rd_kafka_commit(handle, offsets, 0)
            if err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET {
                // Kafka accepts a commit from the current generation here; librdkafka's mock cluster
                // answers REBALANCE_IN_PROGRESS, leaving the last periodic commit in place.
                let error = KafkaError(err, context: "commit on revocation")
                logger.warning("\(error)")
                revocation.reportCommit(error)
            } else {
                revocation.reportCommit(nil)
            }
            if cooperative {
                if let error = rd_kafka_incremental_unassign(handle, list) {
                    logger.error("\(KafkaError(consuming: error, context: "incremental unassign"))")
                }
            } else {
                let err = rd_kafka_assign(handle, nil)
                if err != RD_KAFKA_RESP_ERR_NO_ERROR { logger.error("\(KafkaError(err, context: "unassign"))") }
            }
        }
    }

    /// Stops fetching `partitions`; records already fetched may still arrive.
    public func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError) {
        try pauseOrResume(partitions, pause: true)
    }

    /// Restarts fetching `partitions` from the position they were paused at.
    public func resume(_ partitions: [KafkaTopicPartition]) throws(KafkaError) {
        try pauseOrResume(partitions, pause: false)
    }

    private func pauseOrResume(_ partitions: [KafkaTopicPartition], pause: Bool) throws(KafkaError) {
        guard !partitions.isEmpty else { return }
        let list = RDKafkaTopicPartitionList.make(partitions)
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let what = pause ? "pause" : "resume"
        let err =
            pause ? rd_kafka_pause_partitions(client.handle, list) : rd_kafka_resume_partitions(client.handle, list)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: what) }
        if let error = RDKafkaTopicPartitionList.firstError(list, context: what) { throw error }
    }

    /// Marks records before each offset as done: `offset` is the next record to read.
    public func storeOffsets(_ offsets: [KafkaTopicPartitionOffset]) throws(KafkaError) {
        guard !offsets.isEmpty else { return }
        let list = RDKafkaTopicPartitionList.make(offsets)
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_offsets_store(client.handle, list)
        // Offsets of partitions no longer assigned are refused per partition; that is expected after a revoke.
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__STATE else {
            throw KafkaError(err, context: "store offsets")
        }
    }

    /// Commits the stored offsets now and waits for the broker's answer.
    public func commit() async throws(KafkaError) {
        let client = self.client
        try await RDKafkaBlocking.run { () throws(KafkaError) in
            let err = rd_kafka_commit(client.handle, nil, 0)
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET else {
                throw KafkaError(err, context: "commit")
            }
        }
    }

    /// Commits exactly `offsets` (next offsets to read) and waits for the broker's answer.
    public func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        let client = self.client
        try await RDKafkaBlocking.run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList.make(offsets)
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let err = rd_kafka_commit(client.handle, list, 0)
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "commit") }
            if let error = RDKafkaTopicPartitionList.firstError(list, context: "commit") { throw error }
        }
    }

    /// The group's committed offsets of `partitions` (`-1001` where none is committed).
    public func committed(
        _ partitions: [KafkaTopicPartition], timeout: Duration = .seconds(10)
    ) async throws(KafkaError) -> [KafkaTopicPartitionOffset] {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList.make(partitions)
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let err = rd_kafka_committed(client.handle, list, Int32(timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "committed offsets") }
            return RDKafkaTopicPartitionList.entries(list)
        }
    }

    /// Records behind the end per partition, as librdkafka's latest statistics say (empty unless
    /// `statistics.interval.ms` is set).
    public var lag: [KafkaTopicPartition: Int64] { statistics.lag }

    /// librdkafka's latest statistics of this consumer: partitions' offsets and fetch states,
    /// the group's state (empty unless `statistics.interval.ms` is set).
    public var statistics: KafkaConsumerStatistics { client.callbacks.statistics.withLock { $0 } }

    /// The partitions currently assigned to this member.
    public func assignment() throws(KafkaError) -> [KafkaTopicPartition] {
        var list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>? = nil
        let err = rd_kafka_assignment(client.handle, &list)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { throw KafkaError(err, context: "assignment") }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        return RDKafkaTopicPartitionList.entries(list).map(\.topicPartition)
    }

    /// The metadata a transactional producer needs to commit this group's offsets.
    public func groupMetadata() -> KafkaConsumerGroupMetadata? {
        rd_kafka_consumer_group_metadata(client.handle).map(KafkaConsumerGroupMetadata.init(pointer:))
    }

    /// Leaves the group (revoking and committing as in a rebalance) and ends ``events``.
    public func close() async {
        guard closing.set() else { return }
        let poller = self.poller.withLock { $0 }
        await poller?.stop()
        let client = self.client
        _ = try? await RDKafkaBlocking.run { () throws(KafkaError) in
            let err = rd_kafka_consumer_close(client.handle)
            if err != RD_KAFKA_RESP_ERR_NO_ERROR {
                client.logger.warning("consumer close: \(KafkaError(err, context: ""))")
            }
        }
        sink.finish()
    }
}

/// Set once when ``KafkaConsumer/close()`` starts, so the final revocation does not wait for a reader.
private final class ClosingFlag: Sendable {
    private let flag = Atomic<Bool>(false)

    var isSet: Bool { flag.load(ordering: .acquiring) }

    /// Sets the flag; `true` for the first caller only.
    func set() -> Bool { !flag.exchange(true, ordering: .acquiringAndReleasing) }
}

/// Where the poll thread puts what it read: records are gathered into batches, and any other event
/// first hands over the records gathered before it, so order is kept.
private final class EventSink: Sendable {
    private let continuation: AsyncStream<KafkaConsumerEvent>.Continuation
    private let pending = Mutex<[KafkaMessage]>([])

    init(_ continuation: AsyncStream<KafkaConsumerEvent>.Continuation) {
        self.continuation = continuation
    }

    func append(_ message: KafkaMessage) {
        pending.withLock { $0.append(message) }
    }

    func flush() {
        let batch = pending.withLock { pending -> [KafkaMessage] in
            let batch = pending
            pending = []
            return batch
        }
        if !batch.isEmpty { continuation.yield(.messages(batch)) }
    }

    @discardableResult
    func yield(_ event: KafkaConsumerEvent) -> AsyncStream<KafkaConsumerEvent>.Continuation.YieldResult {
        flush()
        return continuation.yield(event)
    }

    func finish() {
        flush()
        continuation.finish()
    }
}
