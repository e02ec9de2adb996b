import CRdKafka
import Foundation
import Synchronization

/// Produces records and reports when the broker acknowledged them.
///
/// Idempotent with `acks=all` unless the configuration says otherwise. Delivery reports are served
/// on a thread of the producer's own, never on the cooperative pool.
public final class KafkaProducer: Sendable {
    let client: RDKafkaClient
    private let poller: RDKafkaPollThread
    private let logger: Logger

    /// Creates a producer; `configuration` must name `bootstrap.servers`.
    ///
    /// - Parameters:
    ///   - onDeliveries: receives the answers for records produced with a token
    ///     (``produce(_:token:)``), in batches, on the producer's thread.
    ///   - keepingAcknowledged: a topic whose acknowledged records come back whole in their
    ///     ``KafkaDelivery`` (key, value and partition, copied on the producer's thread), such as a
    ///     changelog that a local store mirrors.
    public init(
        configuration: KafkaConfiguration, logger: Logger = Logger(label: "kafka.producer"),
        keepingAcknowledged topic: String? = nil, onDeliveries: (@Sendable ([KafkaDelivery]) -> Void)? = nil
    ) throws(KafkaError) {
        var configuration = configuration
        configuration.setDefault("enable.idempotence", "true")
        configuration.setDefault("acks", "all")
        configuration.setDefault("linger.ms", "5")
        self.logger = logger
        let batch = onDeliveries.map(RDKafkaDeliveryBatch.init)
        self.client = try RDKafkaClient.make(
            .producer, configuration: configuration,
            callbacks: RDKafkaCallbacks(logger: logger, deliveries: batch, keepingAcknowledged: topic),
            deliveryReports: true)
        let client = self.client
        self.poller = RDKafkaPollThread(name: "encore.producer") {
            rd_kafka_poll(client.handle, 100)
            batch?.flush()
        }
    }

    /// Enqueues `record` and calls `onDelivery` (on the producer's thread) once the broker
    /// acknowledged it or delivery failed. Throws when the record cannot be enqueued.
    public func produce(
        _ record: KafkaProducerRecord,
        onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void
    ) throws(KafkaError) {
        let delivery = Unmanaged.passRetained(RDKafkaDelivery(onDelivery)).toOpaque()
        if let error = enqueue(record, opaque: delivery) {
            Unmanaged<RDKafkaDelivery>.fromOpaque(delivery).release()
            throw error
        }
    }

    /// Enqueues `record`; the broker's answer reaches the `onDeliveries` handler given at creation,
    /// with `token` (at most `UInt.max >> 1`). No allocation per record beyond librdkafka's copy.
    public func produce(_ record: KafkaProducerRecord, token: UInt) throws(KafkaError) {
        precondition(client.callbacks.deliveries != nil, "produce(_:token:) needs a producer made with onDeliveries")
        precondition(token <= RDKafkaOpaque.largestToken, "delivery token too large")
        if let error = enqueue(record, opaque: RDKafkaOpaque.token(token)) { throw error }
    }

    /// Enqueues the record in `buffer`, as ``produce(_:token:)`` does a record value: librdkafka
    /// copies the buffer's bytes, so the buffer may be reused at once.
    public func produce(_ buffer: borrowing KafkaRecordBuffer, token: UInt) throws(KafkaError) {
        precondition(client.callbacks.deliveries != nil, "produce(_:token:) needs a producer made with onDeliveries")
        precondition(token <= RDKafkaOpaque.largestToken, "delivery token too large")
        if let error = enqueue(buffer, opaque: RDKafkaOpaque.token(token)) { throw error }
    }

    /// Produces `record` and returns once the broker acknowledged it; throws the delivery error.
    ///
    /// A full local queue is waited out rather than reported.
    @discardableResult
    public func send(_ record: KafkaProducerRecord) async throws -> KafkaDeliveryReport {
        while true {
            do {
                return try await withCheckedThrowingContinuation { continuation in
                    do {
                        try produce(record) { continuation.resume(with: $0) }
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            } catch let error as KafkaError where error.code == .queueFull {
                try await Task.sleep(for: .milliseconds(2))
            }
        }
    }

    /// Fetches `topic`'s metadata (partitions and their leaders) now, so the first records produced
    /// to it do not wait for it. Returns the number of partitions.
    ///
    /// Asks twice, within `timeout` in all: an idempotent producer asks for its producer id when a
    /// metadata answer arrives, from a broker whose connection is up then. At the first answer only
    /// the bootstrap connections are up, and are being replaced by the brokers the answer names, so
    /// (librdkafka 2.16 on a cluster of several brokers) the id waited for librdkafka's next try,
    /// 500 ms later, and so did every record produced meanwhile: a steady-rate generator's first
    /// half second measured as latency. The second answer comes from a named broker, connected, and
    /// the id is asked for before it returns.
    @discardableResult
    public func prepare(topic: String, timeout: Duration = .seconds(10)) async throws(KafkaError) -> Int {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) in
            guard let handle = rd_kafka_topic_new(client.handle, topic, nil) else {
                throw KafkaError(code: .invalidConfiguration, message: "cannot use topic '\(topic)'")
            }
            defer { rd_kafka_topic_destroy(handle) }
            let clock = ContinuousClock()
            let deadline = clock.now.advanced(by: timeout)
            var partitions: Int?
            for _ in 0..<2 {
                var metadata: UnsafePointer<rd_kafka_metadata>? = nil
                let left = Int32(max(1, (deadline - clock.now).milliseconds))
                let err = rd_kafka_metadata(client.handle, 0, handle, &metadata, left)
                guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
                    // (The second answer only hastens the producer id: the first one's count stands.)
                    if let partitions { return partitions }
                    throw KafkaError(err, context: "metadata of topic '\(topic)'")
                }
                defer { rd_kafka_metadata_destroy(metadata) }
                partitions = metadata.pointee.topic_cnt > 0 ? Int(metadata.pointee.topics[0].partition_cnt) : 0
            }
            return partitions ?? 0
        }
    }

    /// Waits until every enqueued record was delivered or failed.
    public func flush(timeout: Duration = .seconds(30)) async throws(KafkaError) {
        let client = self.client
        try await RDKafkaBlocking.run { () throws(KafkaError) in
            let err = rd_kafka_flush(client.handle, Int32(timeout.milliseconds))
            // Deliveries this thread served while flushing.
            client.callbacks.deliveries?.flush()
            if err != RD_KAFKA_RESP_ERR_NO_ERROR {
                throw KafkaError(err, context: "flush did not complete within \(timeout)")
            }
        }
    }

    /// Records not yet delivered (queued or in flight).
    public var outstandingCount: Int { Int(rd_kafka_outq_len(client.handle)) }

    /// Flushes (bounded by `timeout`) and stops the delivery thread.
    public func close(timeout: Duration = .seconds(30)) async {
        do {
            try await flush(timeout: timeout)
        } catch {
            logger.warning("closing producer with undelivered records: \(error)")
        }
        await poller.stop()
    }

    // MARK: Transactions

    /// Registers `transactional.id` with the coordinator; call once before the first transaction.
    public func initTransactions(timeout: Duration = .seconds(30)) async throws(KafkaError) {
        try await transactionCall("init transactions") { rd_kafka_init_transactions($0, Int32(timeout.milliseconds)) }
    }

    public func beginTransaction() throws(KafkaError) {
        if let error = rd_kafka_begin_transaction(client.handle) {
            throw KafkaError(consuming: error, context: "begin transaction")
        }
    }

    /// Adds consumer offsets (next offsets to read) to the current transaction.
    public func sendOffsetsToTransaction(
        _ offsets: [KafkaTopicPartitionOffset], groupMetadata: KafkaConsumerGroupMetadata,
        timeout: Duration = .seconds(30)
    ) async throws(KafkaError) {
        try await transactionCall("send offsets to transaction") { handle in
            let list = RDKafkaTopicPartitionList.make(offsets)
            defer { rd_kafka_topic_partition_list_destroy(list) }
            return rd_kafka_send_offsets_to_transaction(
                handle, list, groupMetadata.pointer, Int32(timeout.milliseconds))
        }
    }

    public func commitTransaction(timeout: Duration = .seconds(30)) async throws(KafkaError) {
        try await transactionCall("commit transaction") { rd_kafka_commit_transaction($0, Int32(timeout.milliseconds)) }
    }

    public func abortTransaction(timeout: Duration = .seconds(30)) async throws(KafkaError) {
        try await transactionCall("abort transaction") { rd_kafka_abort_transaction($0, Int32(timeout.milliseconds)) }
    }

    private func transactionCall(
        _ what: String, _ body: @escaping @Sendable (OpaquePointer) -> OpaquePointer?
    ) async throws(KafkaError) {
        let client = self.client
        try await RDKafkaBlocking.run { () throws(KafkaError) in
            if let error = body(client.handle) { throw KafkaError(consuming: error, context: what) }
        }
    }

    // MARK: Enqueue

    private func enqueue(_ record: KafkaProducerRecord, opaque: UnsafeMutableRawPointer) -> KafkaError? {
        var headers: OpaquePointer? = nil
        if !record.headers.isEmpty {
            headers = rd_kafka_headers_new(record.headers.count)
            // (By index, borrowed in place: a for-in loop would retain each key and value.)
            for index in record.headers.indices {
                // withCString: passing the String itself would copy it to the heap first.
                record.headers[index].key.withCString { key in
                    if record.headers[index].value != nil {
                        record.headers[index].value!.withUnsafeBytes {
                            _ = rd_kafka_header_add(headers, key, -1, $0.baseAddress, $0.count)
                        }
                    } else {
                        _ = rd_kafka_header_add(headers, key, -1, nil, 0)
                    }
                }
            }
        }
        return record.value.withUnsafeBytes { value in
            withOptionalBytes(record.key) { key in
                enqueue(
                    topic: record.topic, partition: record.partition, key: key, value: value, headers: headers,
                    opaque: opaque)
            }
        }
    }

    private func enqueue(_ buffer: borrowing KafkaRecordBuffer, opaque: UnsafeMutableRawPointer) -> KafkaError? {
        var headers: OpaquePointer? = nil
        if !buffer.headers.isEmpty {
            headers = rd_kafka_headers_new(buffer.headers.count)
            buffer.headers.forEach { key, value in
                _ = rd_kafka_header_add(
                    headers, key.baseAddress?.assumingMemoryBound(to: CChar.self), key.count, value?.baseAddress,
                    value?.count ?? 0)
            }
        }
        return buffer.value.withUnsafeBytes { value in
            withOptionalBytes(buffer.hasKey ? buffer.key : nil) { key in
                enqueue(
                    topic: buffer.topic, partition: buffer.partition, key: key, value: value, headers: headers,
                    opaque: opaque)
            }
        }
    }

    /// Enqueues a record of borrowed parts (librdkafka copies them); `headers`, when given, is
    /// handed to librdkafka on success and destroyed here otherwise.
    private func enqueue(
        topic: String, partition: Int32?, key: UnsafeRawBufferPointer?, value: UnsafeRawBufferPointer,
        headers: OpaquePointer?, opaque: UnsafeMutableRawPointer
    ) -> KafkaError? {
        let error: OpaquePointer? = topic.withCString { topic in
            // On the stack: a produce allocates nothing of its own.
            withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 7) { fields in
                fields.initialize(repeating: rd_kafka_vu_t())
                fields[0].vtype = RD_KAFKA_VTYPE_TOPIC
                fields[0].u.cstr = topic
                fields[1].vtype = RD_KAFKA_VTYPE_VALUE
                fields[1].u.mem.ptr = UnsafeMutableRawPointer(mutating: value.baseAddress)
                fields[1].u.mem.size = value.count
                fields[2].vtype = RD_KAFKA_VTYPE_KEY
                fields[2].u.mem.ptr = UnsafeMutableRawPointer(mutating: key?.baseAddress)
                fields[2].u.mem.size = key?.count ?? 0
                fields[3].vtype = RD_KAFKA_VTYPE_MSGFLAGS
                fields[3].u.i = RD_KAFKA_MSG_F_COPY
                fields[4].vtype = RD_KAFKA_VTYPE_OPAQUE
                fields[4].u.ptr = opaque
                var count = 5
                if let partition {
                    fields[count].vtype = RD_KAFKA_VTYPE_PARTITION
                    fields[count].u.i32 = partition
                    count += 1
                }
                if let headers {
                    fields[count].vtype = RD_KAFKA_VTYPE_HEADERS
                    fields[count].u.headers = headers
                    count += 1
                }
                return rd_kafka_produceva(client.handle, fields.baseAddress, count)
            }
        }
        guard let error else { return nil }
        if let headers { rd_kafka_headers_destroy(headers) }
        return KafkaError(consuming: error, context: "produce to topic '\(topic)'")
    }
}

private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}

/// The group metadata a transactional producer needs to commit consumer offsets.
///
/// `@unchecked Sendable`: wraps an immutable `rd_kafka_consumer_group_metadata_t`, destroyed only in `deinit`.
public final class KafkaConsumerGroupMetadata: @unchecked Sendable {
    let pointer: OpaquePointer

    init(pointer: OpaquePointer) { self.pointer = pointer }

    deinit { rd_kafka_consumer_group_metadata_destroy(pointer) }
}

/// A thread that calls `body` in a loop until stopped: librdkafka's blocking polls live here.
final class RDKafkaPollThread: Sendable {
    private let running = Atomic<Bool>(true)
    private let finished = Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    init(name: String, body: @escaping @Sendable () -> Void) {
        Thread.startNamed(name) { [self] in
            while running.load(ordering: .acquiring) { body() }
            let waiters = finished.withLock { state in
                state.done = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    var isRunning: Bool { running.load(ordering: .acquiring) }

    /// Asks the loop to end and waits until it has.
    func stop() async {
        running.store(false, ordering: .releasing)
        await withCheckedContinuation { continuation in
            let done = finished.withLock { state in
                if !state.done { state.waiters.append(continuation) }
                return state.done
            }
            if done { continuation.resume() }
        }
    }
}

extension Duration {
    /// Whole microseconds (negative durations count as zero).
    package var wholeMicroseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0, attoseconds >= 0 else { return 0 }
        return UInt64(seconds) * 1_000_000 + UInt64(attoseconds / 1_000_000_000_000)
    }

    /// Whole milliseconds, saturated to `Int32` as librdkafka's timeouts expect.
    package var milliseconds: Int {
        let (seconds, attoseconds) = components
        let total = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        return Int(min(total, Int64(Int32.max)))
    }
}
