/// Subscription state another manager (RevenueCat, Superwall, a store's server notifications)
/// reports for a user, read from the optional sources topic (`schemas/entitlement-source.schema.json`).
public struct EntitlementSourceEvent: EncoreEvent, Hashable {
    public static let eventType = EventType.entitlementSource

    public var appID: String
    public var appUserID: String
    /// The reporting manager, e.g. `revenuecat`; letters, digits, `_`, `.` and `-`.
    public var source: String
    public var entitlementID: String
    public var isActive: Bool
    public var expiresAtMs: Int64?
    public var eventID: String
    /// When the source observed this state: an older state never replaces a newer one.
    public var occurredAtMs: Int64

    public init(
        appID: String, appUserID: String, source: String, entitlementID: String, isActive: Bool,
        expiresAtMs: Int64? = nil, eventID: String, occurredAtMs: Int64
    ) {
        self.appID = appID
        self.appUserID = appUserID
        self.source = source
        self.entitlementID = entitlementID
        self.isActive = isActive
        self.expiresAtMs = expiresAtMs
        self.eventID = eventID
        self.occurredAtMs = occurredAtMs
    }

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    /// Whether `name` is a valid source name (`^[A-Za-z0-9_.-]{1,64}$`).
    public static func isValidSourceName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 64 && name.utf8.allSatisfy(StringPattern.sourceName.allows)
    }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] { Self.table.encode(self) }
}

extension EntitlementSourceEvent: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            appID: "", appUserID: "", source: "", entitlementID: "", isActive: false, eventID: "", occurredAtMs: 0),
        [
            .field("app_id", \.appID, .appID),
            .field("app_user_id", \.appUserID),
            .field("source", \.source, StringRule(maxLength: 64, pattern: .sourceName)),
            .field("entitlement_id", \.entitlementID),
            .field("is_active", \.isActive),
            .field("expires_at_ms", \.expiresAtMs),
            .field("event_id", \.eventID),
            .field("occurred_at_ms", \.occurredAtMs),
        ])
}
