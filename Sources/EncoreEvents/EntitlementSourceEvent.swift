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
        !name.isEmpty && name.utf8.count <= 64
            && name.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
            }
    }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.decode(jsonBytes) { (json) throws(EventValidationError) in
            let state = try EntitlementStateRecord.Source(json)
            guard Self.isValidSourceName(state.source) else {
                throw EventValidationError(
                    .badFormat, field: "source", "'source' may hold only letters, digits, '_', '.' and '-'")
            }
            return try EntitlementSourceEvent(
                appID: json.string("app_id"), appUserID: json.string("app_user_id"), source: state.source,
                entitlementID: state.entitlementID,
                isActive: state.isActive, expiresAtMs: state.expiresAtMs, eventID: state.eventID,
                occurredAtMs: state.occurredAtMs)
        }
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        EntitlementStateRecord.Source(self).writeFields(to: &writer)
        writer.endObject()
        return writer.bytes
    }
}
