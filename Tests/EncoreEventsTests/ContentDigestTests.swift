import Testing

@testable import EncoreEvents

/// A request's content digest is journaled and compared with the digest of a re-sent record, by
/// this version and by later ones: its value for given content must never change.
@Suite("Content digest of a request")
struct ContentDigestTests {
    static let bare = PurchaseRequestEvent(
        requestID: "req-1", appID: "app_1", appUserID: "user-1", productID: "com.app.pro", store: .appStore,
        environment: .sandbox, requestedAtMs: 1_764_475_643_000)

    static let whole = PurchaseRequestEvent(
        requestID: "req-2", appID: "app_1", appUserID: "usér \"2\"", productID: "com.app.pro", store: .playStore,
        environment: .production, requestedAtMs: 1_764_475_643_001, placementID: "paywall", promoOfferID: "promo",
        campaignID: "spring", offerID: "offer-7", entitlement: Entitlement(type: .freeTrial, value: 1.5, unit: .months),
        deadlineAtMs: 1_764_475_700_000, attributes: ["b": "2", "a": "1", "ä": ""])

    @Test("is the same value it was when journal records first held it")
    func pinned() {
        #expect(Self.bare.contentDigest == "ce5ecba7a84ac437")
        #expect(Self.whole.contentDigest == "c8c69229953b2417")
        // Sixteen digits, leading zeros kept.
        var zeros = Self.bare
        zeros.requestID = "req-409"
        #expect(zeros.contentDigest == "00242ac242a9de95")
        // One attribute (digested without sorting), as the benchmark's requests carry.
        var one = Self.bare
        one.attributes = ["pad": "x"]
        #expect(one.contentDigest == "978aeb72be3e9a50")
    }

    @Test("tells apart content that only moves a byte from one field to the next")
    func lengthPrefixed() {
        var moved = Self.bare
        moved.requestID = "req-1a"
        moved.appID = "pp_1"
        #expect(moved.contentDigest != Self.bare.contentDigest)
        var unset = Self.bare
        unset.placementID = ""
        #expect(unset.contentDigest != Self.bare.contentDigest)
    }
}
