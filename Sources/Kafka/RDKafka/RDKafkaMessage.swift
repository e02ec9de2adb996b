import CRdKafka
import Foundation

/// Reading fields of an `rd_kafka_message_t` (consumed, or handed back in a delivery report).
enum RDKafkaMessage {
    static func value(_ message: UnsafePointer<rd_kafka_message_t>) -> [UInt8] {
        let m = message.pointee
        return m.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: m.len)) } ?? []
    }

    static func key(_ message: UnsafePointer<rd_kafka_message_t>) -> [UInt8]? {
        let m = message.pointee
        return m.key.map { Array(UnsafeRawBufferPointer(start: $0, count: m.key_len)) }
    }

    /// The record's headers, copied into one buffer.
    static func headerBuffer(_ message: UnsafePointer<rd_kafka_message_t>) -> KafkaHeaderBuffer {
        var buffer = KafkaHeaderBuffer()
        var native: OpaquePointer? = nil
        guard rd_kafka_message_headers(message, &native) == RD_KAFKA_RESP_ERR_NO_ERROR, let native else {
            return buffer
        }
        var name: UnsafePointer<CChar>? = nil
        var bytes: UnsafeRawPointer? = nil
        var size = 0
        // Sized first: the buffer's two arrays are allocated once.
        var (count, total) = (0, 0)
        while rd_kafka_header_get_all(native, count, &name, &bytes, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
            total += (name.map { strlen($0) } ?? 0) + (bytes == nil ? 0 : size)
            count += 1
        }
        buffer.reserve(headers: count, bytes: total)
        for index in 0..<count {
            guard rd_kafka_header_get_all(native, index, &name, &bytes, &size) == RD_KAFKA_RESP_ERR_NO_ERROR else {
                break
            }
            let key =
                name.map { UnsafeRawBufferPointer(start: $0, count: strlen($0)) }
                ?? UnsafeRawBufferPointer(start: nil, count: 0)
            buffer.append(keyBytes: key, value: bytes.map { UnsafeRawBufferPointer(start: $0, count: size) })
        }
        return buffer
    }

    static func headers(_ message: UnsafePointer<rd_kafka_message_t>) -> [KafkaHeader] {
        headerBuffer(message).values
    }
}

extension KafkaProducerRecord {
    /// The record a delivery report is about, as it was produced (to produce it again).
    init(delivered message: UnsafePointer<rd_kafka_message_t>) {
        let m = message.pointee
        self.init(
            topic: m.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? "?",
            partition: m.partition >= 0 ? m.partition : nil, key: RDKafkaMessage.key(message),
            value: RDKafkaMessage.value(message), headers: RDKafkaMessage.headers(message))
    }

    /// An acknowledged record of the kept topic `topic`: its partition, key and value (no headers).
    init(acknowledged message: UnsafePointer<rd_kafka_message_t>, topic: String) {
        self.init(
            topic: topic, partition: message.pointee.partition, key: RDKafkaMessage.key(message),
            value: RDKafkaMessage.value(message))
    }
}
