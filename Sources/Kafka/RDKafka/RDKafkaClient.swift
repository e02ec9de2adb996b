import CRdKafka
import Foundation
import Synchronization

/// The Swift-side state librdkafka's C callbacks reach through the handle's opaque pointer.
///
/// Immutable after creation; the closures are `@Sendable` because librdkafka calls them from its
/// own threads.
final class RDKafkaCallbacks: Sendable {
    let logger: Logger
    let onError: (@Sendable (KafkaError) -> Void)?
    let onRebalance:
        (@Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void)?
    /// Where deliveries of records produced with a token gather until the poll that served them ends.
    let deliveries: RDKafkaDeliveryBatch?
    /// The topic whose acknowledged records are copied into their delivery, and its name as a C
    /// string (compared with the message's topic name without building a String).
    let keptTopic: String?
    private let keptTopicName: [CChar]?
    /// The client's latest statistics from librdkafka (`statistics.interval.ms`).
    let statistics = Mutex(KafkaConsumerStatistics())

    init(
        logger: Logger, onError: (@Sendable (KafkaError) -> Void)? = nil,
        onRebalance: (
            @Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) ->
                Void
        )? = nil,
        deliveries: RDKafkaDeliveryBatch? = nil, keepingAcknowledged topic: String? = nil
    ) {
        self.logger = logger
        self.onError = onError
        self.onRebalance = onRebalance
        self.deliveries = deliveries
        self.keptTopic = topic
        self.keptTopicName = topic.map { Array($0.utf8CString) }
    }

    /// Whether the acknowledged `message` is of the topic whose records are kept.
    func keeps(_ message: rd_kafka_message_t) -> Bool {
        guard let keptTopicName, let topic = message.rkt, let name = rd_kafka_topic_name(topic) else { return false }
        return keptTopicName.withUnsafeBufferPointer { strcmp($0.baseAddress!, name) == 0 }
    }

    static func from(_ opaque: UnsafeMutableRawPointer?) -> RDKafkaCallbacks? {
        opaque.map { Unmanaged<RDKafkaCallbacks>.fromOpaque($0).takeUnretainedValue() }
    }
}

/// Completion of one produced record, carried through librdkafka as the message opaque.
final class RDKafkaDelivery: Sendable {
    let completion: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void

    init(_ completion: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void) {
        self.completion = completion
    }
}

/// Deliveries of records produced with a token, handed to the producer's handler together once
/// the poll that served them returns: one call per batch of broker answers instead of one per record.
final class RDKafkaDeliveryBatch: Sendable {
    private let handler: @Sendable ([KafkaDelivery]) -> Void
    private let pending = Mutex<[KafkaDelivery]>([])

    init(_ handler: @escaping @Sendable ([KafkaDelivery]) -> Void) {
        self.handler = handler
    }

    func append(_ delivery: KafkaDelivery) {
        pending.withLock { $0.append(delivery) }
    }

    /// Hands over what gathered. Under the lock, so batches reach the handler in the order they gathered.
    func flush() {
        pending.withLock { pending in
            guard !pending.isEmpty else { return }
            handler(pending.takeAll())
        }
    }
}

/// How a message's opaque says what it carries: a retained ``RDKafkaDelivery`` (an aligned,
/// even address) or a caller's token, stored shifted with the low bit set.
enum RDKafkaOpaque {
    static let largestToken = UInt.max >> 1

    static func token(_ token: UInt) -> UnsafeMutableRawPointer {
        UnsafeMutableRawPointer(bitPattern: token << 1 | 1)!
    }

    static func token(of opaque: UnsafeMutableRawPointer) -> UInt? {
        let bits = UInt(bitPattern: opaque)
        return bits & 1 == 1 ? bits >> 1 : nil
    }
}

/// Owns one `rd_kafka_t` handle and the callback state it points to.
///
/// `@unchecked Sendable`: librdkafka documents its handle as thread-safe for every call made through
/// this type; `handle` is immutable and destroyed only in `deinit`, after every user is gone.
final class RDKafkaClient: @unchecked Sendable {
    let handle: OpaquePointer
    let callbacks: RDKafkaCallbacks
    let logger: Logger

    private init(handle: OpaquePointer, callbacks: RDKafkaCallbacks) {
        self.handle = handle
        self.callbacks = callbacks
        self.logger = callbacks.logger
    }

    deinit {
        rd_kafka_destroy(handle)
    }

    enum Kind {
        case producer, consumer
    }

    static func make(
        _ kind: Kind, configuration: KafkaConfiguration, callbacks: RDKafkaCallbacks, deliveryReports: Bool = false
    ) throws(KafkaError) -> RDKafkaClient {
        let conf = try configuration.makeNativeConfiguration()
        rd_kafka_conf_set_opaque(conf, Unmanaged.passUnretained(callbacks).toOpaque())
        rd_kafka_conf_set_log_cb(conf) { handle, level, facility, text in
            guard let handle, let callbacks = RDKafkaCallbacks.from(rd_kafka_opaque(handle)) else { return }
            var level = Logger.Level(syslog: level)
            guard callbacks.logger.isEnabled(level) else { return }
            let facility = facility.map { String(cString: $0) } ?? "-"
            let message = text.map { String(cString: $0) } ?? ""
            // One -X list configures producer and consumer alike; each ignoring the other's
            // properties is expected, not worth a warning.
            if facility == "CONFWARN" && message.contains("will be ignored by this") { level = .debug }
            guard callbacks.logger.isEnabled(level) else { return }
            callbacks.logger.log(level, "librdkafka \(facility): \(message)")
        }
        rd_kafka_conf_set_stats_cb(conf) { _, json, length, opaque in
            guard let callbacks = RDKafkaCallbacks.from(opaque), let json else { return 0 }
            let statistics = KafkaConsumerStatistics.parse(UnsafeRawBufferPointer(start: json, count: length))
            callbacks.statistics.withLock { $0 = statistics }
            return 0  // librdkafka frees the JSON
        }
        rd_kafka_conf_set_error_cb(conf) { _, code, reason, opaque in
            guard let callbacks = RDKafkaCallbacks.from(opaque) else { return }
            let isFatal = code == RD_KAFKA_RESP_ERR__FATAL.rawValue
            let error = KafkaError(
                rd_kafka_resp_err_t(rawValue: code), context: reason.map { String(cString: $0) } ?? "",
                isFatal: isFatal)
            // Transport errors are routine (broker restarts); librdkafka recovers from them itself.
            callbacks.logger.log(isFatal ? .error : .warning, "librdkafka error \(error)")
            callbacks.onError?(error)
        }
        if deliveryReports {
            rd_kafka_conf_set_dr_msg_cb(conf) { _, message, clientOpaque in
                guard let message, let opaque = message.pointee._private else { return }
                if let token = RDKafkaOpaque.token(of: opaque) {
                    let m = message.pointee
                    guard let callbacks = RDKafkaCallbacks.from(clientOpaque), let batch = callbacks.deliveries
                    else { return }
                    if m.err == RD_KAFKA_RESP_ERR_NO_ERROR {
                        let kept =
                            callbacks.keeps(m)
                            ? KafkaProducerRecord(acknowledged: message, topic: callbacks.keptTopic ?? "") : nil
                        batch.append(KafkaDelivery(token: token, error: nil, record: kept, offset: m.offset))
                    } else {
                        let record = KafkaProducerRecord(delivered: message)
                        batch.append(
                            KafkaDelivery(
                                token: token,
                                error: KafkaError(m.err, context: "delivery to topic '\(record.topic)' failed"),
                                record: record))
                    }
                    return
                }
                let delivery = Unmanaged<RDKafkaDelivery>.fromOpaque(opaque).takeRetainedValue()
                let m = message.pointee
                if m.err == RD_KAFKA_RESP_ERR_NO_ERROR {
                    let topic = String(cString: rd_kafka_topic_name(m.rkt))
                    delivery.completion(
                        .success(KafkaDeliveryReport(topic: topic, partition: m.partition, offset: m.offset)))
                } else {
                    let topic = m.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? "?"
                    delivery.completion(.failure(KafkaError(m.err, context: "delivery to topic '\(topic)' failed")))
                }
            }
        }
        if callbacks.onRebalance != nil {
            rd_kafka_conf_set_rebalance_cb(conf) { handle, code, partitions, opaque in
                guard let handle, let partitions, let callbacks = RDKafkaCallbacks.from(opaque) else { return }
                callbacks.onRebalance?(handle, code, partitions)
            }
        }
        var errorText = [CChar](repeating: 0, count: 512)
        let type = kind == .producer ? RD_KAFKA_PRODUCER : RD_KAFKA_CONSUMER
        guard let handle = rd_kafka_new(type, conf, &errorText, errorText.count) else {
            rd_kafka_conf_destroy(conf)
            throw KafkaError(
                code: .invalidConfiguration, message: "cannot create Kafka client: \(String(cBuffer: errorText))")
        }
        return RDKafkaClient(handle: handle, callbacks: callbacks)
    }

    /// The fatal error of this instance, if one was raised.
    func fatalError() -> KafkaError? {
        var text = [CChar](repeating: 0, count: 512)
        let code = rd_kafka_fatal_error(handle, &text, text.count)
        guard code != RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
        return KafkaError(code, context: String(cBuffer: text), isFatal: true)
    }
}

/// Helpers for `rd_kafka_topic_partition_list_t`.
enum RDKafkaTopicPartitionList {
    static func make(_ entries: [KafkaTopicPartitionOffset]) -> UnsafeMutablePointer<rd_kafka_topic_partition_list_t> {
        let list = rd_kafka_topic_partition_list_new(Int32(max(entries.count, 1)))!
        for entry in entries {
            let element = rd_kafka_topic_partition_list_add(list, entry.topic, entry.partition)!
            element.pointee.offset = entry.offset
            if let metadata = entry.metadata {
                // librdkafka frees the metadata with the list: allocate it with malloc.
                let bytes = Array(metadata.utf8)
                let copy = malloc(max(bytes.count, 1))!
                bytes.withUnsafeBytes { copy.copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
                element.pointee.metadata = copy
                element.pointee.metadata_size = bytes.count
            }
        }
        return list
    }

    static func make(_ partitions: [KafkaTopicPartition]) -> UnsafeMutablePointer<rd_kafka_topic_partition_list_t> {
        make(partitions.map { KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: -1001) })
    }

    static func entries(_ list: UnsafePointer<rd_kafka_topic_partition_list_t>) -> [KafkaTopicPartitionOffset] {
        (0..<Int(list.pointee.cnt)).map { index in
            let element = list.pointee.elems[index]
            let metadata = element.metadata.flatMap { pointer in
                element.metadata_size > 0
                    ? String(
                        decoding: UnsafeRawBufferPointer(start: pointer, count: element.metadata_size), as: UTF8.self)
                    : nil
            }
            return KafkaTopicPartitionOffset(
                topic: String(cString: element.topic), partition: element.partition, offset: element.offset,
                metadata: metadata)
        }
    }

    /// The first per-partition error in `list`, if any.
    static func firstError(_ list: UnsafePointer<rd_kafka_topic_partition_list_t>, context: String) -> KafkaError? {
        for index in 0..<Int(list.pointee.cnt) {
            let element = list.pointee.elems[index]
            if element.err != RD_KAFKA_RESP_ERR_NO_ERROR {
                return KafkaError(
                    element.err, context: "\(context) \(String(cString: element.topic))[\(element.partition)]")
            }
        }
        return nil
    }
}

/// Runs blocking librdkafka calls off the cooperative thread pool, each on a thread of its own,
/// started at once: a slow one holds up no other. (libdispatch's pool, which served them before,
/// stops adding threads at its limit: on a busy machine, calls waited there for seconds.) They
/// are few (commits, flushes, metadata, admin requests), so a thread each costs little.
///
/// What a call captured (a client) is let go on its thread before the caller resumes: a client's
/// last reference released there destroyed it while the caller went on, and exited the process
/// meanwhile (librdkafka 2.16 crashed at exit, after `topics create` and after a processor stopped).
enum RDKafkaBlocking {
    static func run<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) async throws(KafkaError) -> T {
        let call = Call(body)
        let result: Result<T, KafkaError> = await withCheckedContinuation { continuation in
            Thread.startNamed("encore.blocking") { continuation.resume(returning: call.run()) }
        }
        return try result.get()
    }

    /// A call's body, run once and let go.
    private final class Call<T: Sendable>: Sendable {
        private let body: Mutex<(@Sendable () throws(KafkaError) -> T)?>

        init(_ body: @escaping @Sendable () throws(KafkaError) -> T) { self.body = Mutex(body) }

        /// Runs the body, which nothing holds any more once this returns.
        func run() -> Result<T, KafkaError> {
            let taken = body.withLock { body in
                defer { body = nil }
                return body
            }
            guard let taken else { preconditionFailure("a blocking call run twice") }
            do throws(KafkaError) { return .success(try taken()) } catch { return .failure(error) }
        }
    }
}

extension String {
    /// Decodes a NUL-terminated C string held in a fixed-size buffer.
    init(cBuffer buffer: [CChar]) {
        let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        self.init(decoding: bytes, as: UTF8.self)
    }
}
