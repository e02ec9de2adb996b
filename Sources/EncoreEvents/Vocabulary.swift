/// The store a purchase goes through.
public enum Store: String, Sendable, CaseIterable {
    case appStore = "APP_STORE"
    case playStore = "PLAY_STORE"
    case stripe = "STRIPE"
    case other = "OTHER"
}

/// Production or sandbox purchases.
public enum PurchaseEnvironment: String, Sendable, CaseIterable {
    case production = "PRODUCTION"
    case sandbox = "SANDBOX"
}

/// The outcome of one purchase request: the controller's answer, or why it was not attempted.
public enum OutcomeResult: String, Sendable, CaseIterable {
    case purchased
    case cancelled
    case pending
    case failed
    case notAttempted = "not_attempted"
}

/// Why an outcome is `pending`: the controller deferred it (Ask to Buy, SCA), or billing's answer
/// is unknown and the processor keeps asking (the request is *in doubt*).
public enum PendingReason: String, Sendable, CaseIterable {
    /// The controller answered `.pending`.
    case deferred
    /// The attempts ran out with the effect unknown (a timeout, a lost connection, a 5xx): billing
    /// may have charged. A final outcome follows once billing answers a recovery call.
    case outcomeUnknown = "outcome_unknown"
}

/// Encore's grant kinds, in Encore's spelling.
public enum EntitlementType: String, Sendable, CaseIterable {
    case freeTrial
    case discount
    case credit
}

/// Units of a grant's value, in Encore's spelling.
public enum EntitlementUnit: String, Sendable, CaseIterable {
    case months
    case days
    case percent
    case dollars
}

/// `provisional` grants come from pending purchases; `verified` ones from completed purchases.
public enum EntitlementStatus: String, Sendable, CaseIterable {
    case provisional
    case verified
}

/// What happened to an entitlement.
public enum EntitlementChangeKind: String, Sendable, CaseIterable {
    case granted
    case verified
    case expired
    case revoked
}

/// An offer's grant: `{type, value, unit}`, e.g. a 7-day free trial.
public struct Entitlement: Sendable, Hashable {
    public var type: EntitlementType
    public var value: Double
    public var unit: EntitlementUnit

    public init(type: EntitlementType, value: Double, unit: EntitlementUnit) {
        self.type = type
        self.value = value
        self.unit = unit
    }
}

extension Entitlement: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(type: .credit, value: 0, unit: .days),
        [
            .field("type", \.type),
            .field("value", \.value, 0...1_000_000),
            .field("unit", \.unit),
        ])
}

extension Entitlement {
    /// Reads an `{type, value, unit}` object (a catalog entry); the error names the field under `path`.
    public init(json: JSONValue, path: String) throws(EventValidationError) {
        self = try Self.table.read(JSONFieldReader(json, path: path))
    }
}
