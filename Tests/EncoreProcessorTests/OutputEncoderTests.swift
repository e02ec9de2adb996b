import EncoreEvents
@testable import EncoreProcessor
import Kafka
import Testing

@Suite("Output encoding into one reused record buffer")
struct OutputEncoderTests {
    static let configuration: ProcessorConfiguration = {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        configuration.source = "/test-source"
        configuration.journal.perUserCap = 10
        return configuration
    }()

    /// What a record of `type` must carry: the CloudEvents headers in their order, with its id and time.
    static func headers(_ type: EventType, id: String, timeMs: Int64, trace: [KafkaHeader] = []) -> [KafkaHeader] {
        CloudEventHeaders(id: id, source: "/test-source", type: type, timeMs: timeMs).headers.map {
            KafkaHeader(key: $0.key, string: $0.value)
        } + trace
    }

    static let outcome = PurchaseOutcomeEvent(
        requestID: "req-with-a-long-identifier-0001", appID: "app_long_identifier", appUserID: "user-000123",
        productID: "com.app.monthly_premium", result: .failed, attempts: 3, store: .appStore, environment: .production,
        requestedAtMs: 1_796_000_000_000, completedAtMs: 1_796_000_000_250, controller: "billing",
        error: .init(
            type: "timeout", message: String(repeating: "billing did not answer; ", count: 20), retryable: true))
    static let journal = JournalRecord(
        appID: "app", appUserID: "u7", seq: 23,
        entry: .init(
            requestID: "r-9", attempts: 2, startedAtMs: 1_796_000_000_100, result: .purchased,
            completedAtMs: 1_796_000_000_300, digest: "0123456789abcdef"))
    static let intent = JournalRecord(
        appID: "app", appUserID: "u8", seq: 4,
        entry: .init(requestID: "r-10", attempts: 1, startedAtMs: 1_796_000_001_000))
    static let state = EntitlementStateRecord(
        appID: "app", appUserID: "u7", sequence: 12, updatedAtMs: 1_796_000_000_400)
    static let change = EntitlementChangeEvent(
        appID: "app", appUserID: "u7", change: .granted, entitlement: nil, status: .verified, isActive: true,
        effectiveAtMs: 1_796_000_000_500, sequence: 13, requestID: "r-9")
    static let letter = DeadLetterEvent(
        originalTopic: "encore.purchase-requests", originalPartition: 2, originalOffset: 41,
        originalValue: .init(bytes: Array("not json".utf8)),
        error: .init(stage: .decode, errorClass: "invalid_json", message: "not JSON", retryable: false), attempts: 0,
        failedAtMs: 1_796_000_000_600)
    static let trace = [
        KafkaHeader(key: "traceparent", string: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    ]

    /// Each output with the record it must become, built here by hand from the contract.
    static var cases: [(name: String, output: UnsentOutput, expected: KafkaProducerRecord)] {
        let journalKey = Array(":3:app:u7".utf8)
        return [
            (
                "outcome", .outcome(outcome, trace: trace),
                KafkaProducerRecord(
                    topic: configuration.outcomesTopic, key: Array("app_long_identifier:user-000123".utf8),
                    value: outcome.jsonBytes(),
                    headers: headers(
                        .purchaseOutcome, id: "outcome:req-with-a-long-identifier-0001",
                        timeMs: outcome.completedAtMs, trace: trace))
            ),
            (
                "journal result", .journal(journal, partition: 5),
                KafkaProducerRecord(
                    topic: configuration.stateTopic, partition: 5, key: journalKey, value: journal.jsonBytes(),
                    // The processor's own bookkeeping, read only by it: no CloudEvents headers.
                    headers: [])
            ),
            (
                "journal intent", .journal(intent, partition: 1),
                KafkaProducerRecord(
                    topic: configuration.stateTopic, partition: 1, key: Array(":4:app:u8".utf8),
                    value: intent.jsonBytes(), headers: [])
            ),
            (
                "state", .state(state, partition: 5),
                KafkaProducerRecord(
                    topic: configuration.stateTopic, partition: 5, key: Array("app:u7".utf8), value: state.jsonBytes(),
                    headers: headers(.entitlementState, id: "state:app:u7:12:1796000000400", timeMs: 1_796_000_000_400))
            ),
            (
                "change", .change(change, trace: trace),
                KafkaProducerRecord(
                    topic: configuration.entitlementsTopic, key: Array("app:u7".utf8), value: change.jsonBytes(),
                    headers: headers(
                        .entitlementChanged, id: "entitlement:app:u7:13:\(fnv1aHex(change.jsonBytes()))",
                        timeMs: 1_796_000_000_500, trace: trace))
            ),
            (
                "dead letter without a key", .deadLetter(letter, key: nil, trace: []),
                KafkaProducerRecord(
                    topic: configuration.deadLetterTopic, key: nil, value: letter.jsonBytes(),
                    headers: headers(
                        .deadLetter, id: "deadletter:encore.purchase-requests/2/41", timeMs: 1_796_000_000_600))
            ),
            (
                "dead letter with an empty key", .deadLetter(letter, key: [], trace: trace),
                KafkaProducerRecord(
                    topic: configuration.deadLetterTopic, key: [], value: letter.jsonBytes(),
                    headers: headers(
                        .deadLetter, id: "deadletter:encore.purchase-requests/2/41", timeMs: 1_796_000_000_600,
                        trace: trace))
            ),
        ]
    }

    static func expectEqual(_ actual: KafkaProducerRecord, _ expected: KafkaProducerRecord, _ name: String) {
        #expect(actual.topic == expected.topic, "\(name): topic")
        #expect(actual.partition == expected.partition, "\(name): partition")
        #expect(actual.key == expected.key, "\(name): key")
        #expect(actual.value == expected.value, "\(name): value")
        #expect(actual.headers == expected.headers, "\(name): headers")
    }

    /// The change event id's digest, computed here independently: 64-bit FNV-1a as 16 hex digits.
    static func fnv1aHex(_ bytes: [UInt8]) -> String {
        var hash: UInt64 = 14_695_981_039_346_656_037
        for byte in bytes { hash = (hash ^ UInt64(byte)) &* 1_099_511_628_211 }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }

    @Test("hex digits of a digest: always 16, leading zeros kept, lowercase")
    func hexDigits() {
        for (value, expected) in [
            (UInt64(0), "0000000000000000"), (0x1f, "000000000000001f"), (0xdead_beef_0000_0001, "deadbeef00000001"),
            (.max, "ffffffffffffffff"),
        ] {
            var bytes: [UInt8] = Array("x:".utf8)
            OutputEncoder.appendHex(value, to: &bytes)
            #expect(String(decoding: bytes, as: UTF8.self) == "x:" + expected)
        }
    }

    @Test("each output becomes its contract record, alone in a new buffer")
    func eachAlone() {
        let encoder = OutputEncoder(configuration: Self.configuration)
        for (name, output, expected) in Self.cases {
            var buffer = KafkaRecordBuffer()
            encoder.encode(output, into: &buffer)
            Self.expectEqual(buffer.record, expected, name)
        }
    }

    @Test("one buffer reused for every output, in every order, leaves nothing of the record before")
    func reused() {
        let encoder = OutputEncoder(configuration: Self.configuration)
        let cases = Self.cases
        var buffer = KafkaRecordBuffer()
        // Every ordered pair: a long record then a short one, a keyed one then one without a key,
        // more headers then fewer, a partition then none.
        for first in cases.indices {
            for second in cases.indices {
                encoder.encode(cases[first].output, into: &buffer)
                encoder.encode(cases[second].output, into: &buffer)
                Self.expectEqual(
                    buffer.record, cases[second].expected, "\(cases[first].name) then \(cases[second].name)")
            }
        }
    }

    @Test("a record produced again after a failed delivery is copied whole into the buffer")
    func redelivery() {
        let encoder = OutputEncoder(configuration: Self.configuration)
        var buffer = KafkaRecordBuffer()
        encoder.encode(.outcome(Self.outcome, trace: Self.trace), into: &buffer)
        let record = KafkaProducerRecord(
            topic: "t", partition: 3, key: nil, value: [1, 2, 3],
            headers: [
                KafkaHeader(key: "a", value: nil), KafkaHeader(key: "b", value: []), KafkaHeader(key: "c", string: "x"),
            ])
        encoder.encode(.record(record), into: &buffer)
        Self.expectEqual(buffer.record, record, "redelivery")
    }
}
