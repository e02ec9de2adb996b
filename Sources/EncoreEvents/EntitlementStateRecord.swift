import Synchronization

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
        /// A failure the processor decided (a final error, a retryable one that reached no billing
        /// with no attempts left; an in-doubt request's expiry, result `pending`) is journaled
        /// before its outcome (or dead letter) is published, with what rebuilds that outcome exactly:
        /// its error, controller and the record's offset. A restart that reads the same record
        /// again publishes the same outcome rather than asking billing again.
        public var error: PurchaseOutcomeEvent.Failure?
        public var controller: String?
        /// The request record's offset (of the user's partition): what a `request_id_conflict`
        /// dead letter names as the first use of the id.
        public var offset: Int64?
        /// When the request went in doubt (attempts used up, billing's answer unknown): its
        /// `pending` outcome is published and the processor keeps asking billing, until
        /// `--reconcile-for` past this time. Absent on requests never in doubt.
        public var inDoubtSinceMs: Int64?
        /// The request's content digest (``PurchaseRequestEvent/contentDigest``): a later record
        /// with the same `request_id` and another digest is a conflict, not a duplicate.
        public var digest: String?

        public init(
            requestID: String, attempts: Int, startedAtMs: Int64, result: OutcomeResult? = nil,
            completedAtMs: Int64? = nil, error: PurchaseOutcomeEvent.Failure? = nil, controller: String? = nil,
            offset: Int64? = nil, inDoubtSinceMs: Int64? = nil, digest: String? = nil
        ) {
            self.requestID = requestID
            self.attempts = attempts
            self.startedAtMs = startedAtMs
            self.result = result
            self.completedAtMs = completedAtMs
            self.error = error
            self.controller = controller
            self.offset = offset
            self.inDoubtSinceMs = inDoubtSinceMs
            self.digest = digest
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
    public var grants: [Grant] {
        get { grantList.items }
        set { grantList = GrantList(newValue) }
    }
    /// ``grants`` with their JSON, encoded once per list however often the record is written.
    var grantList: GrantList
    public var sources: [Source]
    /// The last published answer of each access rule, by rule name.
    public var access: [String: Bool]
    /// The request journal: the user's recent results, then the intents in flight, each oldest first.
    public var journal: RequestJournal
    /// The journal's entries (decoded: for reading and tests; the processor uses ``journal``).
    public var requests: [RequestEntry] {
        get { journal.entries }
        set { journal = RequestJournal(newValue) }
    }

    public init(
        appID: String, appUserID: String, sequence: Int64 = 0, updatedAtMs: Int64 = 0, grants: [Grant] = [],
        sources: [Source] = [], access: [String: Bool] = [:], requests: [RequestEntry] = []
    ) {
        self.appID = appID
        self.appUserID = appUserID
        self.sequence = sequence
        self.updatedAtMs = updatedAtMs
        self.grantList = GrantList(grants)
        self.sources = sources
        self.access = access
        self.journal = RequestJournal(requests)
    }

    /// The largest record accepted (librdkafka's default `message.max.bytes` is 1,000,000).
    public static let maximumBytes = 1 << 20

    /// The record key: `"{app_id}:{app_user_id}"`.
    public var key: String { userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] { Self.table.encode(self) }

    /// Writes ``jsonBytes()``'s JSON into `writer` (a reused buffer).
    public func write(to writer: inout JSONWriter) { Self.table.write(self, to: &writer) }

    /// One access rule's last answer, as the record holds it.
    struct AccessAnswer: FieldTabled {
        var rule: String
        var isActive: Bool

        static let table = FieldTable<Self>(
            blank: Self(rule: "", isActive: false),
            [
                .field("rule", \.rule, .name(maxLength: 64)),
                .field("is_active", \.isActive),
            ])
    }

    /// ``access`` as the record writes it: one object per rule, by rule name.
    var accessAnswers: [AccessAnswer] {
        get { access.sorted(by: { $0.key < $1.key }).map { AccessAnswer(rule: $0.key, isActive: $0.value) } }
        set { access = Dictionary(newValue.map { ($0.rule, $0.isActive) }, uniquingKeysWith: { $1 }) }
    }
}

extension EntitlementStateRecord: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(appID: "", appUserID: "", sequence: 0, updatedAtMs: 0),
        // A user's record holds grants and the request journal: larger than an event, sized at once.
        byteLimit: maximumBytes,
        capacity: { record in
            256 + 200 * (record.grants.count + record.sources.count) + record.journal.encodedSizeEstimate
                + 48 * record.access.count
        },
        [
            .field("app_id", \.appID),
            .field("app_user_id", \.appUserID),
            .field("sequence", \.sequence),
            .field("updated_at_ms", \.updatedAtMs),
            .field("grants", \.grantList, 1000),
            .field("sources", \.sources, 1000),
            .field("access", \.accessAnswers, 64),
            // Absent (and omitted while empty) in records written before the journal existed.
            .field(
                "requests", \.journal, RequestEntry.maximumCount, whenAbsent: RequestJournal(),
                omittedWhen: RequestJournal()),
        ])
}

/// A record's grants and their JSON, encoded the first time a record holding them is written: a
/// user's grants change far less often than the user's record is written (twice per request, the
/// intent and the result). The list is immutable; a change makes a new one (``grants``' setter).
struct GrantList: Sendable, Hashable {
    let items: [EntitlementStateRecord.Grant]
    /// `nil` for no grants (most users' records: nothing to keep, nothing to retain per copy).
    private let encoded: EncodedOnce?

    init(_ items: [EntitlementStateRecord.Grant]) {
        self.items = items
        encoded = items.isEmpty ? nil : EncodedOnce()
    }

    /// The JSON is the items' and not part of the value.
    static func == (lhs: GrantList, rhs: GrantList) -> Bool { lhs.items == rhs.items }
    func hash(into hasher: inout Hasher) { hasher.combine(items) }
}

/// JSON computed at most once, by whichever thread writes it first (records are encoded on the
/// producer's queue while the loop keeps its copy).
final class EncodedOnce: Sendable {
    private let bytes = Mutex<[UInt8]?>(nil)

    func get(_ encode: () -> [UInt8]) -> [UInt8] {
        bytes.withLock { bytes in
            if let bytes { return bytes }
            let made = encode()
            bytes = made
            return made
        }
    }
}

extension GrantList: FieldValue {
    static var defaultRule: Int { 1000 }

    static func read(_ key: String, from reader: JSONFieldReader, _ maxItems: Int) throws(EventValidationError)
        -> Self?
    {
        try [EntitlementStateRecord.Grant].read(key, from: reader, maxItems).map(Self.init)
    }

    static func scan(_ scanner: inout JSONScanner, _ maxItems: Int) -> Self? {
        [EntitlementStateRecord.Grant].scan(&scanner, maxItems).map(Self.init)
    }

    func write(to writer: inout JSONWriter, _ maxItems: Int) {
        writer.beginArray()
        if let encoded {
            writer.encodedValues(
                encoded.get {
                    // The items, comma-separated: an array's contents without its brackets.
                    var items = JSONWriter(capacity: 200 * self.items.count)
                    for grant in self.items { EntitlementStateRecord.Grant.table.write(grant, to: &items) }
                    return items.bytes
                })
        }
        writer.endArray()
    }

    static func shape(_ maxItems: Int) -> FieldShape { [EntitlementStateRecord.Grant].shape(maxItems) }
}

extension EntitlementStateRecord.Grant: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            productID: "", entitlement: Entitlement.table.blank, status: .provisional, isActive: false,
            grantedAtMs: 0, expiresAtMs: nil, requestID: ""),
        [
            .field("product_id", \.productID),
            .field("entitlement", \.entitlement),
            .field("status", \.status),
            .field("is_active", \.isActive),
            .field("granted_at_ms", \.grantedAtMs),
            .field("expires_at_ms", \.expiresAtMs),
            .field("request_id", \.requestID),
            .field("campaign_id", \.campaignID),
            .field("offer_id", \.offerID),
        ])
}

extension EntitlementStateRecord.Source: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(source: "", entitlementID: "", isActive: false, expiresAtMs: nil, eventID: "", occurredAtMs: 0),
        [
            .field("source", \.source, .name(maxLength: 64)),
            .field("entitlement_id", \.entitlementID),
            .field("is_active", \.isActive),
            .field("expires_at_ms", \.expiresAtMs),
            .field("event_id", \.eventID),
            .field("occurred_at_ms", \.occurredAtMs),
        ])
}

extension EntitlementStateRecord.RequestEntry: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(requestID: "", attempts: 0, startedAtMs: 0),
        [
            .field("request_id", \.requestID),
            .field("attempts", \.attempts),
            .field("started_at_ms", \.startedAtMs),
            .field("result", \.result),
            .field("completed_at_ms", \.completedAtMs),
            .field("error", \.error),
            .field("controller", \.controller),
            .field("offset", \.offset),
            .field("in_doubt_since_ms", \.inDoubtSinceMs),
            .field("digest", \.digest, .digest),
        ])
}
