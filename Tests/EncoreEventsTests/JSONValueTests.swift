import EncoreEvents
import Testing

@Suite("JSON reader")
struct JSONValueTests {
    @Test("parses escapes, surrogate pairs, numbers and nesting")
    func parses() throws {
        let text =
            #"{"a":"x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00","n":[0,-12,3.5,1e3,9223372036854775807],"t":true,"f":false,"z":null}"#
        let value = try JSONValue.parse(Array(text.utf8))
        guard case .object(let fields) = value else { Issue.record("not an object"); return }
        #expect(fields["a"] == .string("x\"\\/\u{8}\u{c}\n\r\té😀"))
        #expect(fields["n"] == .array([.integer(0), .integer(-12), .double(3.5), .double(1000), .integer(.max)]))
        #expect(fields["t"] == .bool(true) && fields["f"] == .bool(false) && fields["z"] == .null)
    }

    @Test(
        "rejects malformed JSON as not_json",
        arguments: [
            "", "{", "{\"a\":}", "{\"a\":1,}", "[1 2]", "01", "1.", "-", "\"\\x\"", "\"\\ud800\"", "{\"a\":1} x",
            "NaN", "tru", "\"a\u{1}\"", String(repeating: "[", count: 100) + String(repeating: "]", count: 100),
        ])
    func rejects(_ text: String) {
        #expect(throws: EventValidationError.self) { try JSONValue.parse(Array(text.utf8)) }
        do {
            _ = try JSONValue.parse(Array(text.utf8))
        } catch {
            #expect(error.code == .notJSON)
        }
    }

    @Test("a record over the size limit is rejected before parsing")
    func oversized() {
        let padding = String(repeating: "x", count: EventLimits.recordBytes)
        let bytes = Array("{\"pad\":\"\(padding)\"}".utf8)
        #expect(throws: EventValidationError.self) { try PurchaseRequestEvent(jsonBytes: bytes) }
        do { _ = try PurchaseRequestEvent(jsonBytes: bytes) } catch { #expect(error.code == .tooLarge) }
    }
}

@Suite("CloudEvents headers")
struct CloudEventHeadersTests {
    @Test("headers round-trip and carry the contract's names")
    func roundTrip() throws {
        let headers = CloudEventHeaders(
            id: "req-1", source: "/encore-processor", type: .purchaseOutcome, timeMs: 1_764_475_643_123)
        let pairs = headers.headers
        #expect(pairs.map(\.key) == ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "content-type"])
        #expect(pairs.first { $0.key == "ce_time" }?.value == "2025-11-30T04:07:23.123Z")
        #expect(pairs.first { $0.key == "ce_type" }?.value == "com.encorekit.purchase.outcome.v1")
        let parsed = try #require(CloudEventHeaders(headers: pairs.map { ($0.key, Optional($0.value)) }))
        #expect(parsed == headers)
        #expect(parsed.eventType == .purchaseOutcome)
        #expect(CloudEventHeaders(headers: [("ce_id", "x")]) == nil)
    }
}
