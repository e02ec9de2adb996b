/// One user's whole entitlement-ledger state: the value of the compacted changelog topic
/// (`schemas/entitlement-state.schema.json`). The latest record per key is the user's state.
public struct EntitlementStateRecord: EncoreEvent, Hashable {
    public static let eventType = EventType.entitlementState

    /// An Encore grant, one per product.
    public struct Grant: Sendable, Hashable {
        public var productID: String
        public var entitlement: Entitlement
        public var status: EntitlementStatus
        /// `false` once expired.
        public var isActive: Bool
        public var grantedAtMs: Int64
        public var expiresAtMs: Int64?
        public var requestID: String
        public var campaignID: String?
        public var offerID: String?

        public init(
            productID: String, entitlement: Entitlement, status: EntitlementStatus, isActive: Bool, grantedAtMs: Int64,
            expiresAtMs: Int64?, requestID: String, campaignID: String? = nil, offerID: String? = nil
        ) {
            self.productID = productID
            self.entitlement = entitlement
            self.status = status
            self.isActive = isActive
            self.grantedAtMs = grantedAtMs
            self.expiresAtMs = expiresAtMs
            self.requestID = requestID
            self.campaignID = campaignID
            self.offerID = offerID
        }
    }

    /// The latest state one other source reported for one of its entitlements.
    public struct Source: Sendable, Hashable {
        /// The state `event` reports.
        public init(_ event: EntitlementSourceEvent) {
            self.init(
                source: event.source, entitlementID: event.entitlementID, isActive: event.isActive,
                expiresAtMs: event.expiresAtMs, eventID: event.eventID, occurredAtMs: event.occurredAtMs)
        }

        public var source: String
        public var entitlementID: String
        public var isActive: Bool
        public var expiresAtMs: Int64?
        public var eventID: String
        public var occurredAtMs: Int64

        public init(
            source: String, entitlementID: String, isActive: Bool, expiresAtMs: Int64?, eventID: String,
            occurredAtMs: Int64
        ) {
            self.source = source
            self.entitlementID = entitlementID
            self.isActive = isActive
            self.expiresAtMs = expiresAtMs
            self.eventID = eventID
            self.occurredAtMs = occurredAtMs
        }

        /// Reads the six fields (a changelog's `sources` item, or a source event's top level).
        init(_ json: JSONFieldReader) throws(EventValidationError) {
            try self.init(
                source: json.string("source", maxLength: 64), entitlementID: json.string("entitlement_id"),
                isActive: json.bool("is_active"), expiresAtMs: json.optionalInt64("expires_at_ms"),
                eventID: json.string("event_id"), occurredAtMs: json.int64("occurred_at_ms"))
        }

        /// Writes the six fields into the object being written.
        func writeFields(to writer: inout JSONWriter) {
            writer.field("source", source)
            writer.field("entitlement_id", entitlementID)
            writer.field("is_active", isActive)
            writer.field("expires_at_ms", expiresAtMs)
            writer.field("event_id", eventID)
            writer.field("occurred_at_ms", occurredAtMs)
        }
    }

    /// The request journal's entry for one of the user's requests: the intent written before its
    /// first call (`result` absent), then its result once the outcome is acknowledged.
    public struct RequestEntry: Sendable, Hashable {
        public var requestID: String
        /// Controller calls made or started so far (the intent's attempt number).
        public var attempts: Int
        /// When the latest call was about to start.
        public var startedAtMs: Int64
        /// The outcome's result; absent while the request is in flight (an intent).
        public var result: OutcomeResult?
        public var completedAtMs: Int64?
        /// A failure the processor decided (timeout, attempts exhausted, no controller) is
        /// journaled before its outcome is published, with what rebuilds that outcome exactly:
        /// its error, controller and the record's offset. A restart that reads the same record
        /// again publishes the same outcome rather than asking billing again.
        public var error: PurchaseOutcomeEvent.Failure?
        public var controller: String?
        public var offset: Int64?

        public init(
            requestID: String, attempts: Int, startedAtMs: Int64, result: OutcomeResult? = nil,
            completedAtMs: Int64? = nil, error: PurchaseOutcomeEvent.Failure? = nil, controller: String? = nil,
            offset: Int64? = nil
        ) {
            self.requestID = requestID
            self.attempts = attempts
            self.startedAtMs = startedAtMs
            self.result = result
            self.completedAtMs = completedAtMs
            self.error = error
            self.controller = controller
            self.offset = offset
        }

        /// The entry's latest time, which retention counts from.
        public var lastTouchedMs: Int64 { max(startedAtMs, completedAtMs ?? 0) }

        /// Most entries one record may hold (the per-user cap is at most this): 1,000 entries of
        /// the longest request ids stay well within ``EntitlementStateRecord/maximumBytes``.
        public static let maximumCount = 1000
    }

    public var appID: String
    public var appUserID: String
    /// The sequence of the user's last published change (0: none yet).
    public var sequence: Int64
    public var updatedAtMs: Int64
    public var grants: [Grant]
    public var sources: [Source]
    /// The last published answer of each access rule, by rule name.
    public var access: [String: Bool]
    /// The request journal: the user's in-flight intents and recent results, oldest first.
    public var requests: [RequestEntry]

    public init(
        appID: String, appUserID: String, sequence: Int64 = 0, updatedAtMs: Int64 = 0, grants: [Grant] = [],
        sources: [Source] = [], access: [String: Bool] = [:], requests: [RequestEntry] = []
    ) {
        self.appID = appID
        self.appUserID = appUserID
        self.sequence = sequence
        self.updatedAtMs = updatedAtMs
        self.grants = grants
        self.sources = sources
        self.access = access
        self.requests = requests
    }

    /// The largest record accepted (librdkafka's default `message.max.bytes` is 1,000,000).
    public static let maximumBytes = 1 << 20

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        // A user's record holds grants and the request journal: larger than an event.
        self = try Self.decode(jsonBytes, limit: Self.maximumBytes) { (json) throws(EventValidationError) in
            var record = try EntitlementStateRecord(
                appID: json.string("app_id"), appUserID: json.string("app_user_id"),
                sequence: json.int64("sequence"), updatedAtMs: json.int64("updated_at_ms"))
            for (index, item) in try json.array("grants", maxItems: 1000).enumerated() {
                let grant = try JSONFieldReader(item, path: "grants.\(index)")
                record.grants.append(
                    try Grant(
                        productID: grant.string("product_id"), entitlement: Entitlement(grant.object("entitlement")),
                        status: grant.enumeration("status"), isActive: grant.bool("is_active"),
                        grantedAtMs: grant.int64("granted_at_ms"), expiresAtMs: grant.optionalInt64("expires_at_ms"),
                        requestID: grant.string("request_id"), campaignID: grant.optionalString("campaign_id"),
                        offerID: grant.optionalString("offer_id")))
            }
            for (index, item) in try json.array("sources", maxItems: 1000).enumerated() {
                record.sources.append(try Source(JSONFieldReader(item, path: "sources.\(index)")))
            }
            for (index, item) in try json.array("access", maxItems: 64).enumerated() {
                let access = try JSONFieldReader(item, path: "access.\(index)")
                record.access[try access.string("rule", maxLength: 64)] = try access.bool("is_active")
            }
            // Absent in records written before the journal existed.
            let requests = try json.optionalArray("requests", maxItems: RequestEntry.maximumCount) ?? []
            for (index, item) in requests.enumerated() {
                let entry = try JSONFieldReader(item, path: "requests.\(index)")
                let error = try entry.optionalObject("error").map { (error) throws(EventValidationError) in
                    try PurchaseOutcomeEvent.Failure(error)
                }
                record.requests.append(
                    try RequestEntry(
                        requestID: entry.string("request_id"), attempts: Int(entry.int64("attempts")),
                        startedAtMs: entry.int64("started_at_ms"), result: entry.optionalEnumeration("result"),
                        completedAtMs: entry.optionalInt64("completed_at_ms"), error: error,
                        controller: entry.optionalString("controller"), offset: entry.optionalInt64("offset")))
            }
            return record
        }
    }

    public func jsonBytes() -> [UInt8] {
        // Sized for the record at once: the journal makes it several times an event's size.
        var writer = JSONWriter(
            capacity: 256 + 200 * (grants.count + sources.count + requests.count) + 48 * access.count)
        writer.beginObject()
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        writer.field("sequence", sequence)
        writer.field("updated_at_ms", updatedAtMs)
        writer.objects("grants", grants) { writer, grant in
            writer.field("product_id", grant.productID)
            grant.entitlement.write("entitlement", to: &writer)
            writer.field("status", grant.status)
            writer.field("is_active", grant.isActive)
            writer.field("granted_at_ms", grant.grantedAtMs)
            writer.field("expires_at_ms", grant.expiresAtMs)
            writer.field("request_id", grant.requestID)
            writer.field("campaign_id", grant.campaignID)
            writer.field("offer_id", grant.offerID)
        }
        writer.objects("sources", sources) { writer, source in source.writeFields(to: &writer) }
        writer.objects("access", access.sorted(by: { $0.key < $1.key })) { writer, access in
            writer.field("rule", access.key)
            writer.field("is_active", access.value)
        }
        // Omitted while empty, as in records written before the journal existed.
        if !requests.isEmpty {
            writer.objects("requests", requests) { writer, entry in
                writer.field("request_id", entry.requestID)
                writer.field("attempts", entry.attempts)
                writer.field("started_at_ms", entry.startedAtMs)
                writer.field("result", entry.result)
                writer.field("completed_at_ms", entry.completedAtMs)
                entry.error?.write("error", to: &writer)
                writer.field("controller", entry.controller)
                writer.field("offset", entry.offset)
            }
        }
        writer.endObject()
        return writer.bytes
    }
}
