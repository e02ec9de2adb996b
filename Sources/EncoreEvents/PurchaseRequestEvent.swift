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
        // The common shape in one pass; anything else (errors included) takes the general path below.
        if let decoded = jsonBytes.withContiguousStorageIfAvailable(PurchaseRequestFastDecoder.decode) ?? nil {
            self = decoded
            return
        }
        self = try Self.decodeGeneral(jsonBytes)
    }

    /// The `request_id` of a record that is not a valid request, when one can be read (for its
    /// dead letter, and for an audit naming it).
    public static func requestIDHint(_ bytes: [UInt8]) -> String? {
        guard bytes.count <= EventLimits.recordBytes, case .object(let fields)? = try? JSONValue.parse(bytes),
            case .string(let id)? = fields["request_id"], !id.isEmpty, id.count <= EventLimits.identifierLength
        else { return nil }
        return id
    }

    /// The general decoder: any valid JSON, and the errors that name the field at fault.
    static func decodeGeneral(_ jsonBytes: some Collection<UInt8>) throws(EventValidationError) -> Self {
        try Self.decode(jsonBytes) { (json) throws(EventValidationError) in
            try PurchaseRequestEvent(
                requestID: json.string("request_id"), appID: json.string("app_id"),
                appUserID: json.string("app_user_id"), productID: json.string("product_id"),
                store: json.enumeration("store"), environment: json.enumeration("environment"),
                requestedAtMs: json.int64("requested_at_ms"), placementID: json.optionalString("placement_id"),
                promoOfferID: json.optionalString("promo_offer_id"), campaignID: json.optionalString("campaign_id"),
                offerID: json.optionalString("offer_id"),
                entitlement: json.optionalObject("entitlement").map { (entitlement) throws(EventValidationError) in
                    try Entitlement(entitlement)
                },
                deadlineAtMs: json.optionalInt64("deadline_at_ms"),
                attributes: json.optionalStringMap(
                    "attributes", maxEntries: EventLimits.attributeCount, maxKeyLength: EventLimits.attributeKeyLength,
                    maxValueLength: EventLimits.attributeValueLength))
        }
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("request_id", requestID)
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        writer.field("product_id", productID)
        writer.field("store", store)
        writer.field("environment", environment)
        writer.field("requested_at_ms", requestedAtMs)
        writer.field("placement_id", placementID)
        writer.field("promo_offer_id", promoOfferID)
        writer.field("campaign_id", campaignID)
        writer.field("offer_id", offerID)
        entitlement?.write("entitlement", to: &writer)
        writer.field("deadline_at_ms", deadlineAtMs)
        if let attributes {
            writer.key("attributes")
            writer.beginObject()
            for (name, value) in attributes.sorted(by: { $0.key < $1.key }) {
                writer.key(dynamic: name)
                writer.string(value)
            }
            writer.endObject()
        }
        writer.endObject()
        return writer.bytes
    }
}
