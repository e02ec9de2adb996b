import EncoreEvents

/// What a controller answers, as in Encore's `EncorePurchaseResult`.
public enum PurchaseResult: Sendable, Hashable {
    case purchased
    case cancelled
    /// Deferred (Ask to Buy, SCA); may complete later.
    case pending

    var outcome: OutcomeResult {
        switch self {
        case .purchased: .purchased
        case .cancelled: .cancelled
        case .pending: .pending
        }
    }
}

/// A purchase the processor asks a controller to perform: Encore's `PurchaseRequest` plus what a
/// server needs to perform it safely.
public struct PurchaseRequest: Sendable, Hashable {
    /// The product to purchase, e.g. `com.app.monthly_premium`.
    public var productId: String { event.productID }
    /// The placement that triggered the purchase, if any.
    public var placementId: String? { event.placementID }
    /// The Encore promotional offer, if any.
    public var promoOfferId: String? { event.promoOfferID }
    /// Idempotency key: pass it to billing APIs that accept one.
    public var requestId: String { event.requestID }
    public var appId: String { event.appID }
    public var appUserId: String { event.appUserID }
    /// The whole request event (store, environment, offer, entitlement, attributes...).
    public let event: PurchaseRequestEvent
    /// 1 for the first call, 2 for the first retry, and so on; it continues across restarts.
    public let attempt: Int
    /// An earlier call of this request may have reached billing: it timed out, failed, or was
    /// running when a processor stopped. Look the purchase up (by ``requestId``, the idempotency
    /// key) before charging. Every call after a request's first carries it.
    public let isRecovery: Bool

    /// The W3C trace context the request record carried (`traceparent`, or CloudEvents'
    /// `ce_traceparent`, and `tracestate`): the http controller passes it on to billing.
    public let traceparent: String?
    public let tracestate: String?

    public init(
        event: PurchaseRequestEvent, attempt: Int = 1, isRecovery: Bool? = nil, traceparent: String? = nil,
        tracestate: String? = nil
    ) {
        self.event = event
        self.attempt = attempt
        self.isRecovery = isRecovery ?? (attempt > 1)
        self.traceparent = traceparent
        self.tracestate = tracestate
    }
}

/// The app's purchase logic, registered with the processor: Encore's `EncorePurchaseController`
/// on the server.
///
/// Return `.purchased`, `.cancelled` or `.pending`; throw for real failures. A thrown error is
/// final unless it is a ``PurchaseControllerError`` with `isRetryable`, so a purchase is never
/// repeated unless the controller says it is safe.
public protocol PurchaseController: Sendable {
    func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult

    /// The answer, when the controller has it without suspending (it is then the call, and costs no
    /// task), or `nil` to be called with ``purchase(_:)`` (the default). Runs on the loop: never block.
    func immediateAnswer(to request: PurchaseRequest) -> Result<PurchaseResult, any Error>?
}

extension PurchaseController {
    public func immediateAnswer(to request: PurchaseRequest) -> Result<PurchaseResult, any Error>? { nil }
}

/// An error a controller throws to say what went wrong, whether trying again is safe, and
/// whether billing may have acted on the call.
public struct PurchaseControllerError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A short stable class, e.g. `http_503`, `billing_unavailable`, `not_found`.
    public var type: String
    public var message: String
    /// Trying again cannot charge twice and may succeed.
    public var isRetryable: Bool
    /// Billing may have acted on the call: its effect is unknown (a store call that timed out, a
    /// connection lost after sending, a 5xx). When the attempts run out on such an error the
    /// request is *in doubt*: `pending` (`outcome_unknown`), never `failed`, and the processor
    /// keeps asking billing with recovery calls until it answers.
    public var isOutcomeUnknown: Bool

    public init(type: String, message: String, isRetryable: Bool, isOutcomeUnknown: Bool = false) {
        self.type = type
        self.message = message
        self.isRetryable = isRetryable
        self.isOutcomeUnknown = isOutcomeUnknown
    }

    /// A failure that may be retried and that billing did not act on (unavailable before it
    /// started, a connection that could not be opened).
    public static func retryable(_ type: String, _ message: String) -> Self {
        Self(type: type, message: message, isRetryable: true)
    }

    /// A call whose effect is unknown: billing may have charged. Retried as a recovery call
    /// (which looks before it charges); in doubt when the attempts run out.
    public static func outcomeUnknown(_ type: String, _ message: String) -> Self {
        Self(type: type, message: message, isRetryable: true, isOutcomeUnknown: true)
    }

    /// A failure that must not be retried.
    public static func final(_ type: String, _ message: String) -> Self {
        Self(type: type, message: message, isRetryable: false)
    }

    public var description: String { "\(type): \(message)" }
}

/// Thrown by a controller that decided not to attempt the purchase (nothing reached billing): the
/// outcome is `not_attempted`, with `type` and `message` as its error, and no dead letter.
public struct PurchaseNotAttempted: Error, Sendable, Hashable, CustomStringConvertible {
    public var type: String
    public var message: String

    public init(type: String, message: String) {
        self.type = type
        self.message = message
    }

    public var description: String { "\(type): \(message)" }
}

/// A controller that replays answers given earlier (`replay`): each outcome keeps the time of the
/// answer it replays, so grants and expiries fall as they did.
public protocol ReplayingController: PurchaseController {
    /// When the replayed answer was given (epoch ms); `nil`: now.
    func recordedCompletion(of request: PurchaseRequest) -> Int64?
}

/// A controller made from a closure.
public struct ClosureController: PurchaseController {
    private let body: @Sendable (PurchaseRequest) async throws -> PurchaseResult

    public init(_ body: @escaping @Sendable (PurchaseRequest) async throws -> PurchaseResult) {
        self.body = body
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        try await body(request)
    }
}
