/// A user's request journal as the changelog record holds it (`requests`): the entries with a
/// result ("settled") kept as their encoded JSON, the intents as values.
///
/// Every changelog record carries the user's whole journal, up to `--dedupe-per-user` entries, and
/// a user's record is rewritten on every update of the user. A settled entry never changes, so it
/// is encoded once, when it settles: writing the record copies those bytes instead of encoding
/// every entry again, and the journal holds no `String` or struct per settled entry.
///
/// The wire order is the settled entries, oldest first, then the intents, oldest first.
public struct RequestJournal: Sendable, Hashable {
    public typealias Entry = EntitlementStateRecord.RequestEntry

    /// Where a settled entry's JSON is in ``settledJSON``, and what finds and prunes it unread.
    private struct Settled: Sendable, Hashable {
        /// 64-bit FNV-1a of the request id: a match is confirmed on the decoded entry.
        var idHash: UInt64
        var start: Int32
        var count: Int32
        var lastTouchedMs: Int64
    }

    /// The settled entries' JSON objects, comma-separated, oldest first.
    private var settledJSON: [UInt8] = []
    private var settled: [Settled] = []
    /// Entries without a result (requests in flight), oldest first.
    private var intents: [Entry] = []

    public init() {}

    /// The journal of `entries`; settled ones go before the intents, each in their order.
    public init(_ entries: some Sequence<Entry>) {
        for entry in entries { append(entry) }
    }

    public var count: Int { settled.count + intents.count }
    /// About how many bytes the journal's JSON takes.
    var encodedSizeEstimate: Int { settledJSON.count + 200 * intents.count }
    public var isEmpty: Bool { settled.isEmpty && intents.isEmpty }

    /// Every entry, in wire order (settled entries decoded: for reading, not for the hot path).
    public var entries: [Entry] { settled.indices.compactMap(decodeSettled) + intents }

    /// The latest entry for `requestID`: an intent, else a settled entry.
    public func entry(requestID: String) -> Entry? {
        if let intent = intents.last(where: { $0.requestID == requestID }) { return intent }
        let hash = Self.hash(requestID)
        for index in settled.indices.reversed() where settled[index].idHash == hash {
            if let entry = decodeSettled(index), entry.requestID == requestID { return entry }
        }
        return nil
    }

    /// Adds `entry` as the newest settled entry (with a result) or intent.
    public mutating func append(_ entry: Entry) {
        guard entry.result != nil else {
            intents.append(entry)
            return
        }
        if !settledJSON.isEmpty { settledJSON.append(UInt8(ascii: ",")) }
        let start = settledJSON.count
        settledJSON.append(contentsOf: Entry.table.encode(entry))
        settled.append(
            Settled(
                idHash: Self.hash(entry.requestID), start: Int32(start), count: Int32(settledJSON.count - start),
                lastTouchedMs: entry.lastTouchedMs))
    }

    /// Removes every entry of `requestID`.
    public mutating func remove(requestID: String) {
        intents.removeAll { $0.requestID == requestID }
        let hash = Self.hash(requestID)
        guard settled.contains(where: { $0.idHash == hash }) else { return }
        removeSettled(
            settled.indices.map { index in
                settled[index].idHash == hash && decodeSettled(index)?.requestID == requestID
            })
    }

    /// Drops entries untouched since before `horizonMs`, then the oldest beyond `cap` (at least
    /// one stays): settled entries first, then intents.
    public mutating func prune(untouchedBefore horizonMs: Int64, cap: Int) {
        if intents.contains(where: { $0.lastTouchedMs < horizonMs }) {
            intents.removeAll { $0.lastTouchedMs < horizonMs }
        }
        if settled.contains(where: { $0.lastTouchedMs < horizonMs }) {
            removeSettled(settled.map { $0.lastTouchedMs < horizonMs })
        }
        let cap = max(1, cap)
        let excess = count - cap
        guard excess > 0 else { return }
        let settledDropped = min(excess, settled.count)
        if settledDropped > 0 { removeSettled(settled.indices.map { $0 < settledDropped }) }
        if excess > settledDropped { intents.removeFirst(excess - settledDropped) }
    }

    /// Removes the settled entries marked in `isRemoved` (one flag per entry), keeping the others in order.
    private mutating func removeSettled(_ isRemoved: [Bool]) {
        var json: [UInt8] = []
        json.reserveCapacity(settledJSON.count)
        var kept: [Settled] = []
        kept.reserveCapacity(settled.count)
        for index in settled.indices where !isRemoved[index] {
            var entry = settled[index]
            if !json.isEmpty { json.append(UInt8(ascii: ",")) }
            let start = json.count
            json.append(contentsOf: settledJSON[Int(entry.start)..<Int(entry.start + entry.count)])
            entry.start = Int32(start)
            kept.append(entry)
        }
        settledJSON = json
        settled = kept
    }

    private func decodeSettled(_ index: Int) -> Entry? {
        let place = settled[index]
        // Encoded here from a valid entry: it decodes.
        return try? Entry.table.decode(settledJSON[Int(place.start)..<Int(place.start + place.count)])
    }

    private static func hash(_ id: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in id.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return hash
    }
}

extension RequestJournal: FieldValue {
    static var defaultRule: Int { Entry.maximumCount }

    static func read(_ key: String, from reader: JSONFieldReader, _ maxItems: Int) throws(EventValidationError)
        -> Self?
    {
        try [Entry].read(key, from: reader, maxItems).map { Self($0) }
    }

    static func scan(_ scanner: inout JSONScanner, _ maxItems: Int) -> Self? {
        [Entry].scan(&scanner, maxItems).map { Self($0) }
    }

    func write(to writer: inout JSONWriter, _ maxItems: Int) {
        writer.beginArray()
        writer.encodedValues(settledJSON)
        let table = Entry.table
        intents.withUnsafeBufferPointer { items in
            for index in items.indices { table.write(at: items.baseAddress! + index, to: &writer) }
        }
        writer.endArray()
    }

    static func shape(_ maxItems: Int) -> FieldShape { [Entry].shape(maxItems) }
}
