@testable import Kafka
import Testing

@Suite("Reused record and header buffers")
struct KafkaRecordBufferTests {
    static let headers = [
        KafkaHeader(key: "ce_id", string: "outcome:req-1"), KafkaHeader(key: "null", value: nil),
        KafkaHeader(key: "empty", value: []), KafkaHeader(key: "clé", string: "välue"),
        KafkaHeader(key: "", string: "no key"),
    ]

    @Test("headers read back as written: order, keys, null and empty values apart")
    func headersRoundTrip() {
        let buffer = KafkaHeaderBuffer(Self.headers)
        #expect(buffer.count == Self.headers.count)
        #expect(buffer.values == Self.headers)
    }

    @Test("a header copied from another buffer, or written in place, is the header")
    func copiedAndWritten() {
        let template = KafkaHeaderBuffer(Self.headers)
        var buffer = KafkaHeaderBuffer()
        for index in (0..<template.count).reversed() { buffer.append(template, at: index) }
        buffer.append(key: "ce_time") { $0.append(contentsOf: Array("2026-12-07T03:00:00.000Z".utf8)) }
        buffer.append(key: "written empty") { _ in }
        #expect(
            buffer.values
                == Self.headers.reversed() + [
                    KafkaHeader(key: "ce_time", string: "2026-12-07T03:00:00.000Z"),
                    KafkaHeader(key: "written empty", value: []),
                ])
    }

    @Test("a buffer emptied and written again holds only the new headers")
    func reused() {
        var buffer = KafkaHeaderBuffer(Self.headers)
        buffer.removeAll()
        #expect(buffer.isEmpty && buffer.values.isEmpty)
        buffer.append(KafkaHeader(key: "k", value: nil))
        #expect(buffer.values == [KafkaHeader(key: "k", value: nil)])
    }

    @Test("a record buffer started anew keeps nothing of the record before: key, none or empty, partition, headers")
    func recordReused() {
        let records = [
            KafkaProducerRecord(
                topic: "long", partition: 3, key: Array(repeating: 7, count: 300),
                value: Array(repeating: 1, count: 900),
                headers: Self.headers),
            KafkaProducerRecord(topic: "t", partition: nil, key: nil, value: [2]),
            KafkaProducerRecord(
                topic: "t", partition: 0, key: [], value: [], headers: [KafkaHeader(key: "a", value: [])]),
        ]
        var buffer = KafkaRecordBuffer()
        for first in records {
            for second in records {
                buffer.begin(with: first)
                buffer.begin(with: second)
                let record = buffer.record
                #expect(record.topic == second.topic && record.partition == second.partition)
                #expect(record.key == second.key && record.value == second.value && record.headers == second.headers)
            }
        }
    }

    @Test("buffers grown past the retained capacity by one large record are let go; smaller ones are kept")
    func shrink() {
        var buffer = KafkaRecordBuffer()
        buffer.begin(topic: "t", partition: nil)
        buffer.value.append(contentsOf: [UInt8](repeating: 0, count: 1000))
        buffer.shrink()
        #expect(buffer.value.capacity >= 1000, "a usual record's room is kept")
        buffer.begin(topic: "t", partition: nil)
        buffer.value.append(contentsOf: [UInt8](repeating: 0, count: KafkaRecordBuffer.retainedCapacity + 1))
        buffer.key.append(contentsOf: [UInt8](repeating: 0, count: KafkaRecordBuffer.retainedCapacity + 1))
        buffer.headers.append(key: "big") {
            $0.append(contentsOf: [UInt8](repeating: 0, count: KafkaRecordBuffer.retainedCapacity + 1))
        }
        buffer.shrink()
        #expect(buffer.value.capacity == 0 && buffer.key.capacity == 0 && buffer.headers.capacity == 0)
    }

    @Test("headers appended from raw bytes read back as appended; the first header of a key gives its value")
    func rawBytesAndFirstValue() {
        var buffer = KafkaHeaderBuffer()
        buffer.reserve(headers: 5, bytes: 64)
        func append(_ key: String, _ value: [UInt8]?) {
            Array(key.utf8).withUnsafeBytes { key in
                if let value {
                    value.withUnsafeBytes { buffer.append(keyBytes: key, value: $0) }
                } else {
                    buffer.append(keyBytes: key, value: nil)
                }
            }
        }
        append("ce_id", Array("first".utf8))
        append("null", nil)
        append("ce_id", Array("second".utf8))
        append("bad", [0xff, 0xfe])
        append("", Array("no key".utf8))
        #expect(
            buffer.values == [
                KafkaHeader(key: "ce_id", string: "first"), KafkaHeader(key: "null", value: nil),
                KafkaHeader(key: "ce_id", string: "second"), KafkaHeader(key: "bad", value: [0xff, 0xfe]),
                KafkaHeader(key: "", string: "no key"),
            ])
        #expect(buffer.firstValue("ce_id") == "first")
        #expect(buffer.firstValue("null") == nil, "no value")
        #expect(buffer.firstValue("bad") == nil, "not UTF-8")
        #expect(buffer.firstValue("") == "no key")
        #expect(buffer.firstValue("ce_i") == nil && buffer.firstValue("ce_id2") == nil, "only the whole key matches")
    }

    @Test("a message's headers are its buffer's: as given, replaced whole, found by key")
    func messageHeaders() {
        var message = KafkaMessage(topic: "t", partition: 0, offset: 0, key: nil, value: [], headers: Self.headers)
        #expect(message.headers == Self.headers)
        #expect(message.header("clé") == "välue" && message.header("null") == nil && message.header("x") == nil)
        message.headers = [KafkaHeader(key: "only", string: "one")]
        #expect(message.headerBuffer.count == 1 && message.header("only") == "one" && message.header("ce_id") == nil)
        #expect(message.hasHeaders)
        message.headers = []
        #expect(!message.hasHeaders && message.headers.isEmpty && message.headerBuffer.isEmpty)
        let bare = KafkaMessage(topic: "t", partition: 0, offset: 0, key: nil, value: [])
        #expect(!bare.hasHeaders && bare.headers.isEmpty && bare.header("ce_id") == nil)
    }
}
