/// The outcome of one purchase request (`com.encorekit.purchase.outcome.v1`).
public struct PurchaseOutcomeEvent: EncoreEvent, Hashable {
    public static let eventType = EventType.purchaseOutcome

    /// Why a request failed: the error's type, message, and whether trying again could help.
    public struct Failure: Sendable, Hashable {
        public var type: String
        public var message: String
        public var retryable: Bool

        public init(type: String, message: String, retryable: Bool) {
            self.type = type
            self.message = message
            self.retryable = retryable
        }

        /// Reads `{type, message, retryable}` (an outcome's `error`, a journal entry's `error`).
        init(_ json: JSONFieldReader) throws(EventValidationError) {
            try self.init(
                type: json.string("type", maxLength: 128),
                message: json.string("message", maxLength: EventLimits.messageLength, allowEmpty: true),
                retryable: json.bool("retryable"))
        }

        /// Writes the failure as the object field `name`.
        func write(_ name: StaticString, to writer: inout JSONWriter) {
            writer.key(name)
            writer.beginObject()
            writer.field("type", type)
            writer.field("message", message)
            writer.field("retryable", retryable)
            writer.endObject()
        }
    }

    public var requestID: String
    public var appID: String
    public var appUserID: String
    public var productID: String
    public var result: OutcomeResult
    /// Controller calls made (0 when not attempted).
    public var attempts: Int
    public var store: Store
    public var environment: PurchaseEnvironment
    public var requestedAtMs: Int64
    public var completedAtMs: Int64
    public var placementID: String?
    public var promoOfferID: String?
    /// Name of the controller that handled the request.
    public var controller: String?
    public var transactionID: String?
    /// Present exactly when `result` is `failed`.
    public var error: Failure?

    public init(
        requestID: String, appID: String, appUserID: String, productID: String, result: OutcomeResult, attempts: Int,
        store: Store, environment: PurchaseEnvironment, requestedAtMs: Int64, completedAtMs: Int64,
        placementID: String? = nil, promoOfferID: String? = nil, controller: String? = nil,
        transactionID: String? = nil, error: Failure? = nil
    ) {
        self.requestID = requestID
        self.appID = appID
        self.appUserID = appUserID
        self.productID = productID
        self.result = result
        self.attempts = attempts
        self.store = store
        self.environment = environment
        self.requestedAtMs = requestedAtMs
        self.completedAtMs = completedAtMs
        self.placementID = placementID
        self.promoOfferID = promoOfferID
        self.controller = controller
        self.transactionID = transactionID
        self.error = error
    }

    /// The outcome of `request`, copying the fields the two events share.
    public init(
        request: PurchaseRequestEvent, result: OutcomeResult, attempts: Int, completedAtMs: Int64,
        controller: String? = nil, transactionID: String? = nil, error: Failure? = nil
    ) {
        self.init(
            requestID: request.requestID, appID: request.appID, appUserID: request.appUserID,
            productID: request.productID, result: result, attempts: attempts, store: request.store,
            environment: request.environment, requestedAtMs: request.requestedAtMs, completedAtMs: completedAtMs,
            placementID: request.placementID, promoOfferID: request.promoOfferID, controller: controller,
            transactionID: transactionID, error: error)
    }

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.decode(jsonBytes) { (json) throws(EventValidationError) in
            let failure = try json.optionalObject("error").map { (error) throws(EventValidationError) in
                try Failure(error)
            }
            let outcome = try PurchaseOutcomeEvent(
                requestID: json.string("request_id"), appID: json.string("app_id"),
                appUserID: json.string("app_user_id"), productID: json.string("product_id"),
                result: json.enumeration("result"), attempts: Int(json.int64("attempts")),
                store: json.enumeration("store"), environment: json.enumeration("environment"),
                requestedAtMs: json.int64("requested_at_ms"), completedAtMs: json.int64("completed_at_ms"),
                placementID: json.optionalString("placement_id"), promoOfferID: json.optionalString("promo_offer_id"),
                controller: json.optionalString("controller", maxLength: 128),
                transactionID: json.optionalString("transaction_id"), error: failure)
            if outcome.result == .failed && outcome.error == nil {
                throw EventValidationError(
                    .missingField, field: "error", "required field 'error' is missing: result is 'failed'")
            }
            return outcome
        }
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("request_id", requestID)
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        writer.field("product_id", productID)
        writer.field("result", result)
        writer.field("attempts", attempts)
        writer.field("store", store)
        writer.field("environment", environment)
        writer.field("requested_at_ms", requestedAtMs)
        writer.field("completed_at_ms", completedAtMs)
        writer.field("placement_id", placementID)
        writer.field("promo_offer_id", promoOfferID)
        writer.field("controller", controller)
        writer.field("transaction_id", transactionID)
        error?.write("error", to: &writer)
        writer.endObject()
        return writer.bytes
    }
}
