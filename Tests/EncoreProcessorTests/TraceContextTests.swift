import EncoreEvents
import Kafka
import Testing

@testable import EncoreProcessor

/// A request record's trace context, read once per work item; the journal's lane of a user, which
/// the worker gives its work items; input partitions as dictionary keys.
@Suite("Trace context, canonical user lanes, input partition keys (no Kafka)")
struct TraceContextTests {
    static let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    static let ceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    @Test("traceparent wins over ce_traceparent, whichever comes first; tracestate likewise; outputs carry both names")
    func precedence() {
        let trace = TraceContext(
            KafkaHeaderBuffer([
                KafkaHeader(key: "ce_traceparent", string: Self.ceParent), KafkaHeader(key: "ce_id", string: "x"),
                KafkaHeader(key: "traceparent", string: Self.parent), KafkaHeader(key: "tracestate", string: "a=1"),
                KafkaHeader(key: "ce_tracestate", string: "b=2"), KafkaHeader(key: "traceparent", string: "later"),
            ]))
        #expect(trace.parent == Self.parent)
        #expect(trace.state == "a=1")
        #expect(
            trace.headers == [
                KafkaHeader(key: "traceparent", string: Self.parent),
                KafkaHeader(key: "ce_traceparent", string: Self.parent),
                KafkaHeader(key: "tracestate", string: "a=1"), KafkaHeader(key: "ce_tracestate", string: "a=1"),
            ])
    }

    @Test(
        "CloudEvents' names alone are used; no context gives no headers; a null or invalid value is no context, and a later valid one is taken",
        arguments: [
            ([KafkaHeader(key: "ce_traceparent", string: ceParent)], ceParent as String?),
            ([KafkaHeader(key: "ce_id", string: "x"), KafkaHeader(key: "traceparent", value: nil)], nil),
            ([KafkaHeader(key: "traceparent", value: [0xff, 0xfe])], nil),
            ([KafkaHeader(key: "traceparent", value: nil), KafkaHeader(key: "traceparent", string: parent)], parent),
            (
                [KafkaHeader(key: "traceparent", value: [0xff]), KafkaHeader(key: "traceparent", string: parent)],
                parent
            ),
            (
                [KafkaHeader(key: "traceparent", value: nil), KafkaHeader(key: "ce_traceparent", string: ceParent)],
                ceParent
            ),
            ([KafkaHeader](), nil),
        ])
    func fallbackAndAbsence(headers: [KafkaHeader], expected: String?) {
        let trace = TraceContext(KafkaHeaderBuffer(headers))
        #expect(trace.parent == expected)
        #expect(trace.state == nil)
        #expect(trace.headers.map(\.key) == (expected == nil ? [] : ["traceparent", "ce_traceparent"]))
    }

    /// Raw bits of a string: equal only when both share one storage (or are the same small string).
    static func bits(_ text: String) -> [UInt8] { withUnsafeBytes(of: text) { Array($0) } }

    @Test(
        "a work item's lane is the one the journal keeps for its user (the key's storage shared), equal to a lane built anew; an unknown user's is built anew"
    )
    func canonicalLanes() {
        var ledger = EntitlementLedger(catalog: EntitlementCatalog())
        // Ids longer than a small string's 15 bytes: each key built has storage of its own.
        let appID = "app_with_a_long_identifier"
        let request = PurchaseRequestEvent(
            requestID: "req-1", appID: appID, appUserID: "user-0001", productID: "p", store: .appStore,
            environment: .production, requestedAtMs: 1)
        _ = ledger.recordIntent(request, attempt: 1, partition: 3, nowMs: 1)
        let kept = ledger.lane(appID: appID, appUserID: "user-0001", partition: 3)
        let again = ledger.lane(appID: appID, appUserID: "user-0001", partition: 3)
        let fresh = UserLane(appID: appID, appUserID: "user-0001")
        #expect(kept == fresh && again == fresh)
        #expect(Self.bits(kept.key) == Self.bits(again.key), "both are the journal's kept lane")
        #expect(Self.bits(kept.key) != Self.bits(fresh.key), "a lane built anew has storage of its own")
        // Another partition's memory does not know the user; neither does this one another user.
        let elsewhere = ledger.lane(appID: appID, appUserID: "user-0001", partition: 4)
        #expect(elsewhere == fresh && Self.bits(elsewhere.key) != Self.bits(kept.key))
        let stranger = ledger.lane(appID: appID, appUserID: "user-0002", partition: 3)
        #expect(stranger == UserLane(appID: appID, appUserID: "user-0002"))
    }

    @Test("input partitions as keys: the same number under both topics are two keys, each found again")
    func inputPartitionKeys() {
        var table: [InputPartition: Int] = [:]
        for number in Int32(0)..<64 {
            table[.requests(number)] = Int(number)
            table[InputPartition(topic: .sources, number: number)] = 1000 + Int(number)
        }
        #expect(table.count == 128)
        for number in Int32(0)..<64 {
            #expect(table[.requests(number)] == Int(number))
            #expect(table[InputPartition(topic: .sources, number: number)] == 1000 + Int(number))
        }
        #expect(table[.requests(64)] == nil)
    }
}
