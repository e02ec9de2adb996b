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
    /// Why the outcome is `pending` (only then): deferred by the controller, or in doubt. This
    /// version writes it on every `pending` outcome; one read without it is `deferred`.
    public var pendingReason: PendingReason?

    public init(
        requestID: String, appID: String, appUserID: String, productID: String, result: OutcomeResult, attempts: Int,
        store: Store, environment: PurchaseEnvironment, requestedAtMs: Int64, completedAtMs: Int64,
        placementID: String? = nil, promoOfferID: String? = nil, controller: String? = nil,
        transactionID: String? = nil, error: Failure? = nil, pendingReason: PendingReason? = nil
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
        self.pendingReason = pendingReason ?? (result == .pending ? .deferred : nil)
    }

    /// The outcome of `request`, copying the fields the two events share.
    public init(
        // (Borrowed: copied whole, the request's other fields were retained and released again.)
        request: borrowing PurchaseRequestEvent, result: OutcomeResult, attempts: Int, completedAtMs: Int64,
        controller: String? = nil, transactionID: String? = nil, error: Failure? = nil,
        pendingReason: PendingReason? = nil
    ) {
        self.init(
            requestID: request.requestID, appID: request.appID, appUserID: request.appUserID,
            productID: request.productID, result: result, attempts: attempts, store: request.store,
            environment: request.environment, requestedAtMs: request.requestedAtMs, completedAtMs: completedAtMs,
            placementID: request.placementID, promoOfferID: request.promoOfferID, controller: controller,
            transactionID: transactionID, error: error, pendingReason: pendingReason)
    }

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    /// Whether it says its request is in doubt (`pending`, `outcome_unknown`): not final, the
    /// request's one final outcome follows. Any other outcome is final (a `deferred` pending too).
    public var isInDoubt: Bool { result == .pending && pendingReason == .outcomeUnknown }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter(capacity: 384 + (error?.message.utf8.count ?? 0))
        write(to: &writer)
        return writer.bytes
    }

    /// Writes ``jsonBytes()``'s JSON into `writer` (a reused buffer). Field by field, not through
    /// the table's closures: one per request (the same bytes, tested).
    public func write(to writer: inout JSONWriter) {
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
        if let error {
            writer.key("error")
            Failure.table.write(error, to: &writer)
        }
        writer.field("pending_reason", pendingReason)
        writer.endObject()
    }
}

extension PurchaseOutcomeEvent: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            requestID: "", appID: "", appUserID: "", productID: "", result: .failed, attempts: 0, store: .other,
            environment: .production, requestedAtMs: 0, completedAtMs: 0),
        validate: { (outcome) throws(EventValidationError) in
            if outcome.result == .failed && outcome.error == nil {
                throw EventValidationError(
                    .missingField, field: "error", "required field 'error' is missing: result is 'failed'")
            }
            // (Absent on a `pending` outcome written before in-doubt requests existed: deferred.)
            if outcome.result != .pending, outcome.pendingReason != nil {
                throw EventValidationError(
                    .inconsistent, field: "pending_reason",
                    "'pending_reason' is only for result 'pending', not '\(outcome.result.rawValue)'")
            }
        },
        [
            .field("request_id", \.requestID),
            .field("app_id", \.appID),
            .field("app_user_id", \.appUserID),
            .field("product_id", \.productID),
            .field("result", \.result),
            .field("attempts", \.attempts),
            .field("store", \.store),
            .field("environment", \.environment),
            .field("requested_at_ms", \.requestedAtMs),
            .field("completed_at_ms", \.completedAtMs),
            .field("placement_id", \.placementID),
            .field("promo_offer_id", \.promoOfferID),
            .field("controller", \.controller, .name(maxLength: 128)),
            .field("transaction_id", \.transactionID),
            .field("error", \.error),
            .field("pending_reason", \.pendingReason),
        ])
}

extension PurchaseOutcomeEvent.Failure: FieldTabled {
    /// The type as written: a controller's error type is not checked where it is made, so one
    /// past the contract's limit is cut, and an empty one is written `unnamed`.
    var wireType: String {
        get { type.isEmpty ? "unnamed" : type.prefix(codePoints: 128) }
        set { type = newValue }
    }

    /// The message as written: cut to the contract's limit, so the outcome stays valid.
    var wireMessage: String {
        get { message.prefix(codePoints: EventLimits.messageLength) }
        set { message = newValue }
    }

    static let table = FieldTable<Self>(
        blank: Self(type: "", message: "", retryable: false),
        [
            .field("type", \.wireType, .name(maxLength: 128)),
            .field("message", \.wireMessage, .text(maxLength: EventLimits.messageLength)),
            .field("retryable", \.retryable),
        ])
}
