/// One request's journal entry as a changelog record of its own (journal v2): the request's
/// intent before a call, then its result. Keyed by ``key``, one of the user's `slotCount` slots
/// (`journal_seq` modulo the per-user cap), so that compaction keeps the user's latest entries and
/// a new entry replaces the one `slotCount` requests older. `schemas/request-journal.schema.json`.
public struct JournalRecord: EncoreEvent, Hashable {
    /// The event's type, though no journal record carries it as a header: the processor writes its
    /// journal without CloudEvents headers (its own bookkeeping; the key tells it apart).
    public static let eventType = EventType.requestJournal

    public var appID: String
    public var appUserID: String
    /// The user's journal counter: one per request journaled, oldest first.
    public var seq: Int64
    public var entry: EntitlementStateRecord.RequestEntry

    public init(appID: String, appUserID: String, seq: Int64, entry: EntitlementStateRecord.RequestEntry) {
        self.appID = appID
        self.appUserID = appUserID
        self.seq = seq
        self.entry = entry
    }

    /// The changelog key of slot `seq % slotCount` of the user: `":{slot}:{app_id}:{app_user_id}"`.
    /// A state record's key (`{app_id}:{app_user_id}`) never starts with `:` (an `app_id` is never
    /// empty and holds no `:`), so the two kinds never share a key.
    public func key(slotCount: Int) -> [UInt8] {
        var key: [UInt8] = []
        key.reserveCapacity(3 + 20 + appID.utf8.count + appUserID.utf8.count)
        appendKey(slotCount: slotCount, to: &key)
        return key
    }

    /// Appends ``key(slotCount:)`` to `key`.
    public func appendKey(slotCount: Int, to key: inout [UInt8]) {
        let slot = seq % Int64(max(1, slotCount))
        key.append(UInt8(ascii: ":"))
        JSONWriter.appendDecimal(slot, to: &key)
        key.append(UInt8(ascii: ":"))
        key.append(contentsOf: appID.utf8)
        key.append(UInt8(ascii: ":"))
        key.append(contentsOf: appUserID.utf8)
    }

    /// Whether a changelog record's key is a journal entry's, `:{digits}:…` (else it is a user's
    /// state: a state record written when an `app_id` could still hold `:` may start with one, but
    /// not with a slot number between two).
    public static func isJournalKey(_ key: [UInt8]?) -> Bool {
        guard let key, key.first == UInt8(ascii: ":") else { return false }
        var digits = 0
        for byte in key.dropFirst() {
            if byte == UInt8(ascii: ":") { return digits > 0 }
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return false }
            digits += 1
        }
        return false
    }

    /// The user key (`{app_id}:{app_user_id}`).
    public var userKey: String { EncoreEvents.userKey(appID: appID, appUserID: appUserID) }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.table.decode(jsonBytes)
    }

    /// The record as compact JSON, fields in schema order: the bytes of `Self.table.encode(self)`.
    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter(capacity: 200 + (entry.error?.message.utf8.count ?? 0))
        write(to: &writer)
        return writer.bytes
    }

    /// Writes ``jsonBytes()``'s JSON into `writer` (a reused buffer). Field by field, not through
    /// the table's closures: written twice per request.
    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.field("app_id", appID)
        writer.field("app_user_id", appUserID)
        writer.field("journal_seq", seq)
        writer.field("request_id", entry.requestID)
        writer.field("attempts", entry.attempts)
        writer.field("started_at_ms", entry.startedAtMs)
        writer.field("result", entry.result)
        writer.field("completed_at_ms", entry.completedAtMs)
        if let error = entry.error {
            writer.key("error")
            PurchaseOutcomeEvent.Failure.table.write(error, to: &writer)
        }
        writer.field("controller", entry.controller)
        writer.field("offset", entry.offset)
        writer.field("in_doubt_since_ms", entry.inDoubtSinceMs)
        writer.field("digest", entry.digest)
        writer.endObject()
    }
}

extension JournalRecord: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(appID: "", appUserID: "", seq: 0, entry: EntitlementStateRecord.RequestEntry.table.blank),
        capacity: { record in 200 + (record.entry.error?.message.utf8.count ?? 0) },
        [
            .field("app_id", \.appID, .appID),
            .field("app_user_id", \.appUserID),
            .field("journal_seq", \.seq),
            .field("request_id", \.entry.requestID),
            .field("attempts", \.entry.attempts),
            .field("started_at_ms", \.entry.startedAtMs),
            .field("result", \.entry.result),
            .field("completed_at_ms", \.entry.completedAtMs),
            .field("error", \.entry.error),
            .field("controller", \.entry.controller),
            .field("offset", \.entry.offset),
            .field("in_doubt_since_ms", \.entry.inDoubtSinceMs),
            .field("digest", \.entry.digest, .digest),
        ])
}
