/// An offer-triggered purchase request (`com.encorekit.purchase.requested.v1`).
public struct PurchaseRequestEvent: EncoreEvent, Hashable {
    public static let eventType = EventType.purchaseRequested

    /// Idempotency key: pass it to billing APIs that accept one.
    public var requestID: String
    public var appID: String
    public var appUserID: String
    public var productID: String
    public var store: Store
    public var environment: PurchaseEnvironment
    public var requestedAtMs: Int64
    public var placementID: String?
    public var promoOfferID: String?
    public var campaignID: String?
    public var offerID: String?
    public var entitlement: Entitlement?
    /// After this instant the purchase must not be attempted any more.
    public var deadlineAtMs: Int64?
    public var attributes: [String: String]?

    /// The attribute that marks a load test's request with the run's id (`encore-processor loadtest`).
    public static let loadTestRunAttribute = "encore_loadtest_run"

    /// The load-test run this request belongs to, if any.
    public var loadTestRun: String? { attributes?[Self.loadTestRunAttribute] }

    public init(
        requestID: String, appID: String, appUserID: String, productID: String, store: Store,
        environment: PurchaseEnvironment, requestedAtMs: Int64, placementID: String? = nil, promoOfferID: String? = nil,
        campaignID: String? = nil, offerID: String? = nil, entitlement: Entitlement? = nil, deadlineAtMs: Int64? = nil,
        attributes: [String: String]? = nil
    ) {
        self.requestID = requestID
        self.appID = appID
        self.appUserID = appUserID
        self.productID = productID
        self.store = store
        self.environment = environment
        self.requestedAtMs = requestedAtMs
        self.placementID = placementID
        self.promoOfferID = promoOfferID
        self.campaignID = campaignID
        self.offerID = offerID
        self.entitlement = entitlement
        self.deadlineAtMs = deadlineAtMs
        self.attributes = attributes
    }

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    /// One per request: specialized here (``EncoreEvent/init(jsonBytes:)-([UInt8])``).
    public init(jsonBytes: [UInt8]) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] { Self.table.encode(self) }

    /// A digest of everything the request says (16 hex digits, FNV-1a over its fields, attributes
    /// in key order): the same on every process and version, so a re-sent record matches its
    /// journal entry and a reused `request_id` with other content does not.
    public var contentDigest: String {
        // (Field by field: an array of the fields would be allocated per request.)
        var digest = ContentDigest()
        digest.add(requestID)
        digest.add(appID)
        digest.add(appUserID)
        digest.add(productID)
        digest.add(store.rawValue)
        digest.add(environment.rawValue)
        digest.add(requestedAtMs)
        digest.add(placementID)
        digest.add(promoOfferID)
        digest.add(campaignID)
        digest.add(offerID)
        digest.add(entitlement.map { "\($0.type.rawValue)/\($0.value)/\($0.unit.rawValue)" })
        digest.add(deadlineAtMs.map(String.init))
        if let attributes, attributes.count == 1, let (key, value) = attributes.first {
            // (One attribute needs no sorted copy.)
            digest.add(key)
            digest.add(value)
        } else if let attributes {
            for (key, value) in attributes.sorted(by: { $0.key < $1.key }) {
                digest.add(key)
                digest.add(value)
            }
        }
        return digest.hex
    }

    /// The `request_id` of a record that is not a valid request, when one can be read (for its
    /// dead letter, and for an audit naming it).
    public static func requestIDHint(_ bytes: [UInt8]) -> String? {
        guard bytes.count <= EventLimits.recordBytes, case .object(let fields)? = try? JSONValue.parse(bytes),
            case .string(let id)? = fields["request_id"], !id.isEmpty, id.count <= EventLimits.identifierLength
        else { return nil }
        return id
    }
}

extension PurchaseRequestEvent: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            requestID: "", appID: "", appUserID: "", productID: "", store: .other, environment: .production,
            requestedAtMs: 0),
        [
            .field("request_id", \.requestID),
            .field("app_id", \.appID, .appID),
            .field("app_user_id", \.appUserID),
            .field("product_id", \.productID),
            .field("store", \.store),
            .field("environment", \.environment),
            .field("requested_at_ms", \.requestedAtMs),
            .field("placement_id", \.placementID),
            .field("promo_offer_id", \.promoOfferID),
            .field("campaign_id", \.campaignID),
            .field("offer_id", \.offerID),
            .field("entitlement", \.entitlement),
            .field("deadline_at_ms", \.deadlineAtMs),
            .field("attributes", \.attributes, .attributes),
        ])
}

/// FNV-1a, 64 bits, over length-prefixed fields (so that no two field lists give one input).
struct ContentDigest {
    private var state: UInt64 = 0xcbf2_9ce4_8422_2325

    private mutating func add(byte: UInt8) {
        state = (state ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
    }

    mutating func add(_ text: String?) {
        guard var text else {
            add(byte: 0xff)
            return
        }
        add(Int64(text.utf8.count))
        text.withUTF8 { utf8 in
            for byte in utf8 { add(byte: byte) }
        }
    }

    mutating func add(_ number: Int64) {
        for shift in stride(from: 0, to: 64, by: 8) { add(byte: UInt8(truncatingIfNeeded: number >> shift)) }
    }

    /// 16 lowercase hex digits, leading zeros kept; one allocation.
    var hex: String {
        String(unsafeUninitializedCapacity: 16) { buffer in
            let digits: StaticString = "0123456789abcdef"
            for index in 0..<16 {
                buffer[index] = digits.utf8Start[Int(truncatingIfNeeded: state >> UInt64(60 - 4 * index)) & 0xf]
            }
            return 16
        }
    }
}
