/// A change of one user's entitlement (`com.encorekit.entitlement.changed.v1`).
public struct EntitlementChangeEvent: EncoreEvent, Hashable {
    public static let eventType = EventType.entitlementChanged

    /// The state one subscription source (RevenueCat, Superwall, Encore...) reports for the user.
    public struct SourceState: Sendable, Hashable {
        public var source: String
        public var isActive: Bool
        public var entitlementID: String?
        public var expiresAtMs: Int64?

        public init(source: String, isActive: Bool, entitlementID: String? = nil, expiresAtMs: Int64? = nil) {
            self.source = source
            self.isActive = isActive
            self.entitlementID = entitlementID
            self.expiresAtMs = expiresAtMs
        }
    }

    public var appID: String
    public var appUserID: String
    public var change: EntitlementChangeKind
    /// The Encore grant that changed; `nil` when the change is a flip of an access rule.
    public var entitlement: Entitlement?
    /// The grant's status; `nil` when the change is a flip of an access rule.
    public var status: EntitlementStatus?
    /// The access rule (e.g. `pro`) whose merged answer flipped; `is_active` is the new answer.
    public var access: String?
    public var isActive: Bool
    public var effectiveAtMs: Int64
    /// Increases with every change of this user, across restarts.
    public var sequence: Int64
    public var expiresAtMs: Int64?
    public var requestID: String?
    public var campaignID: String?
    public var offerID: String?
    /// The merged sources behind an access answer, when the change concerns one.
    public var sources: [SourceState]?

    public init(
        appID: String, appUserID: String, change: EntitlementChangeKind, entitlement: Entitlement?,
        status: EntitlementStatus?, access: String? = nil, isActive: Bool, effectiveAtMs: Int64, sequence: Int64,
        expiresAtMs: Int64? = nil, requestID: String? = nil, campaignID: String? = nil, offerID: String? = nil,
        sources: [SourceState]? = nil
    ) {
        self.appID = appID
        self.appUserID = appUserID
        self.change = change
        self.entitlement = entitlement
        self.status = status
        self.access = access
        self.isActive = isActive
        self.effectiveAtMs = effectiveAtMs
        self.sequence = sequence
        self.expiresAtMs = expiresAtMs
        self.requestID = requestID
        self.campaignID = campaignID
        self.offerID = offerID
        self.sources = sources
    }

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.decode(jsonBytes) { (json) throws(EventValidationError) in
            var sources: [SourceState]? = nil
            if let items = try json.optionalArray("sources", maxItems: 32) {
                sources = []
                for (index, item) in items.enumerated() {
                    let source = try JSONFieldReader(item, path: "sources.\(index)")
                    sources?.append(
                        try SourceState(
                            source: source.string("source", maxLength: 64), isActive: source.bool("is_active"),
                            entitlementID: source.optionalString("entitlement_id"),
                            expiresAtMs: source.optionalInt64("expires_at_ms")))
                }
            }
            // An access flip names its rule instead of a grant; every other change names the grant.
            let access = try json.optionalString("access", maxLength: 64)
            let entitlement = try access == nil ? json.object("entitlement") : json.optionalObject("entitlement")
            return try EntitlementChangeEvent(
                appID: json.string("app_id"), appUserID: json.string("app_user_id"), change: json.enumeration("change"),
                entitlement: entitlement.map { (reader) throws(EventValidationError) in try Entitlement(reader) },
                status: access == nil ? json.enumeration("status") : json.optionalEnumeration("status"),
                access: access, isActive: json.bool("is_active"), effectiveAtMs: json.int64("effective_at_ms"),
                sequence: json.int64("sequence", minimum: 1), expiresAtMs: json.optionalInt64("expires_at_ms"),
                requestID: json.optionalString("request_id"), campaignID: json.optionalString("campaign_id"),
                offerID: json.optionalString("offer_id"), sources: sources)
        }
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        writer.field("change", change)
        entitlement?.write("entitlement", to: &writer)
        writer.field("status", status)
        writer.field("access", access)
        writer.field("is_active", isActive)
        writer.field("effective_at_ms", effectiveAtMs)
        writer.field("sequence", sequence)
        writer.field("expires_at_ms", expiresAtMs)
        writer.field("request_id", requestID)
        writer.field("campaign_id", campaignID)
        writer.field("offer_id", offerID)
        if let sources {
            writer.objects("sources", sources) { writer, source in
                writer.field("source", source.source)
                writer.field("is_active", source.isActive)
                writer.field("entitlement_id", source.entitlementID)
                writer.field("expires_at_ms", source.expiresAtMs)
            }
        }
        writer.endObject()
        return writer.bytes
    }
}
