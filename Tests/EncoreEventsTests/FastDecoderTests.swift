import Foundation
import Testing

@testable import EncoreEvents

@Suite("Purchase request fast decoder")
struct FastDecoderTests {
    /// The fast decoder either declines or gives exactly what the general decoder gives.
    func agree(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> PurchaseRequestEvent? {
        agree(Array(text.utf8), sourceLocation: sourceLocation)
    }

    @discardableResult
    func agree(_ bytes: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) -> PurchaseRequestEvent? {
        let fast = bytes.withUnsafeBufferPointer(PurchaseRequestEvent.table.decodeFast)
        let general = try? PurchaseRequestEvent.table.decodeGeneral(bytes)
        if let fast {
            #expect(fast == general, "\(String(decoding: bytes, as: UTF8.self))", sourceLocation: sourceLocation)
        }
        return fast
    }

    static let base =
        #"{"request_id":"5f0c1e2a-1b2c-4d3e-8f40-123456789abc","app_id":"app_bench","app_user_id":"user-000042","#
        + #""product_id":"com.app.monthly_premium","placement_id":"cancel_flow","store":"APP_STORE","#
        + #""environment":"PRODUCTION","requested_at_ms":1796000000042,"attributes":{"pad":"xxxx"}}"#

    @Test("typical requests (limit.c's, the generator's, the samples') take the fast path and agree")
    func typical() throws {
        #expect(agree(Self.base) != nil)
        let full =
            #"{"request_id":"r-1","app_id":"a","app_user_id":"u","product_id":"p","store":"PLAY_STORE","#
            + #""environment":"SANDBOX","requested_at_ms":0,"placement_id":"pl","promo_offer_id":"po","#
            + #""campaign_id":"c","offer_id":"o","entitlement":{"type":"freeTrial","value":7,"unit":"days"},"#
            + #""deadline_at_ms":1796000009999,"attributes":{}}"#
        #expect(agree(full) != nil)
        let spaced =
            " {\n \"request_id\" : \"r\" ,\"app_id\":\"a\",\"app_user_id\":\"u\",\"product_id\":\"p\",\t"
            + "\"store\":\"OTHER\",\"environment\":\"SANDBOX\",\"requested_at_ms\": 5 , \"entitlement\":"
            + "{ \"value\" : 12.5 , \"unit\":\"percent\",\"type\":\"discount\" } }\n"
        #expect(agree(spaced)?.entitlement?.value == 12.5)
        // Every valid sample, and every request the generator writes (offers with grants included).
        for sample in allSamples() where sample.event == "purchase-request" { agree(sample.bytes) }
        for index in 0..<2000 {
            let request = PurchaseRequestEvent(
                requestID: "req-\(index)", appID: "app", appUserID: "user-\(index % 97)",
                productID: ["rc_pro_monthly", "promo_winback_50", "com.app.credits_100"][index % 3],
                store: .allCases[index % 4], environment: .allCases[index % 2], requestedAtMs: Int64(index) * 7919,
                placementID: index % 2 == 0 ? "paywall" : nil, campaignID: index % 5 == 0 ? "spring" : nil,
                offerID: index % 3 == 0 ? "offer-\(index)" : nil,
                entitlement: index % 4 == 0
                    ? Entitlement(type: .allCases[index % 3], value: Double(index % 50) / 4, unit: .allCases[index % 4])
                    : nil, deadlineAtMs: index % 7 == 0 ? Int64(index) * 100_003 : nil,
                attributes: index % 6 == 0 ? ["locale": "de-DE", "k\(index)": "v"] : nil)
            #expect(agree(request.jsonBytes()) == request)
        }
    }

    @Test("everything unusual or wrong is left to the general decoder")
    func declines() throws {
        func variant(_ from: String, _ to: String) -> String {
            Self.base.replacingOccurrences(of: from, with: to)
        }
        let unusual = [
            variant("user-000042", #"us\"er"#), variant("user-000042", "üser"), variant("user-000042", #"u\u0041"#),
            variant("1796000000042", "1796000000042.0"), variant("1796000000042", "1.796e12"),
            variant("1796000000042", "-1"), variant("1796000000042", "0042"), variant("1796000000042", "\"1\""),
            variant("1796000000042", "null"), variant("1796000000042", "17960000000420000000"),
            variant("APP_STORE", "app_store"), variant("\"user-000042\"", "\"\""),
            variant(#""placement_id":"cancel_flow","#, #""placement_id":"cancel_flow","placement_id":"x","#),
            variant(#""placement_id""#, #""unknown_field""#), variant(#"{"pad":"xxxx"}"#, #"{"a":"1","a":"2"}"#),
            variant(#"{"pad":"xxxx"}"#, #"{"a":1}"#), variant(#"{"pad":"xxxx"}"#, "null"),
            variant("}}", "}},"), variant("}}", "}} x"), String(Self.base.dropLast()),
            variant("cancel_flow", String(repeating: "p", count: 257)),
            variant(#""store":"APP_STORE","#, ""), "{}", "[]", "",
        ]
        for text in unusual { #expect(agree(text) == nil, "\(text)") }
        let entitlement = [
            #"{"type":"freeTrial","value":7}"#, #"{"type":"freeTrial","value":-7,"unit":"days"}"#,
            #"{"type":"freeTrial","value":07,"unit":"days"}"#, #"{"type":"freeTrial","value":1e3,"unit":"days"}"#,
            #"{"type":"freeTrial","value":7,"unit":"days","extra":1}"#,
            #"{"type":"freeTrial","value":.5,"unit":"days"}"#,
            #"{"type":"freeTrial","value":2000000,"unit":"days"}"#, #"{"type":"trial","value":7,"unit":"days"}"#,
        ]
        for object in entitlement {
            #expect(agree(variant(#""attributes":{"pad":"xxxx"}"#, #""entitlement":"# + object)) == nil, "\(object)")
        }
        // At the limits: 256 characters and 64 attributes are fine, one more is not.
        #expect(agree(variant("cancel_flow", String(repeating: "p", count: 256))) != nil)
        let attributes = (0..<64).map { #""k\#($0)":"v""# }.joined(separator: ",")
        #expect(agree(variant(#"{"pad":"xxxx"}"#, "{\(attributes)}")) != nil)
        #expect(agree(variant(#"{"pad":"xxxx"}"#, "{\(attributes),\"k64\":\"v\"}")) == nil)
    }
}
