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
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] { Self.table.encode(self) }

    /// Writes ``jsonBytes()``'s JSON into `writer` (a reused buffer).
    public func write(to writer: inout JSONWriter) { Self.table.write(self, to: &writer) }
}

extension EntitlementChangeEvent: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            appID: "", appUserID: "", change: .granted, entitlement: nil, status: nil, isActive: false,
            effectiveAtMs: 0, sequence: 0),
        validate: { (change) throws(EventValidationError) in
            // An access flip names its rule instead of a grant; every other change names the grant.
            guard change.access == nil else { return }
            for (field, absent) in [("entitlement", change.entitlement == nil), ("status", change.status == nil)]
            where absent {
                throw EventValidationError(
                    .missingField, field: field, "required field '\(field)' is missing: 'access' is absent")
            }
        },
        [
            .field("app_id", \.appID),
            .field("app_user_id", \.appUserID),
            .field("change", \.change),
            .field("entitlement", \.entitlement),
            .field("status", \.status),
            .field("access", \.access, .name(maxLength: 64)),
            .field("is_active", \.isActive),
            .field("effective_at_ms", \.effectiveAtMs),
            .field("sequence", \.sequence, 1),
            .field("expires_at_ms", \.expiresAtMs),
            .field("request_id", \.requestID),
            .field("campaign_id", \.campaignID),
            .field("offer_id", \.offerID),
            .field("sources", \.sources, 32),
        ])
}

extension EntitlementChangeEvent.SourceState: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(source: "", isActive: false),
        [
            .field("source", \.source, .name(maxLength: 64)),
            .field("is_active", \.isActive),
            .field("entitlement_id", \.entitlementID),
            .field("expires_at_ms", \.expiresAtMs),
        ])
}
