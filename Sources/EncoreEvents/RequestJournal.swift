/// A user's request journal (a changelog record's `requests`): entries with a result kept as
/// their JSON, encoded once when they settle, since every record of the user writes them all again.
///
/// The wire order is the settled entries, oldest first, then the entries kept as values.
public struct RequestJournal: Sendable, Hashable {
    public typealias Entry = EntitlementStateRecord.RequestEntry

    /// Where a settled entry's JSON is in ``settledJSON`` (a journal is far below 2 GiB: records
    /// are at most 1 MiB), and what finds and prunes it without decoding it.
    private struct Settled: Sendable, Hashable {
        /// The request id's hash (`String` hashing, as `==` compares): a match is confirmed on the
        /// decoded entry.
        var idHash: Int
        var start: Int32
        var count: Int32
        var lastTouchedMs: Int64
    }

    /// The settled entries' JSON objects, comma-separated, oldest first. Each reads back as the
    /// entry it was encoded from (checked when it settles).
    private var settledJSON: [UInt8] = []
    private var settled: [Settled] = []
    /// Oldest first: the intents (no result yet), and any settled entry whose JSON would not read
    /// back as it is (a controller's error past the contract's limits, cut when written).
    private var values: [Entry] = []

    public init() {}

    /// The journal of `entries`; an id listed twice keeps its last entry, as a search from the
    /// end always found.
    public init(_ entries: some Sequence<Entry>) {
        self.init(entries, decoded: false)
    }

    /// `decoded`: the entries were read from JSON, so they are within the contract's limits and
    /// encoding them loses nothing (no need to read each back).
    init(_ entries: some Sequence<Entry>, decoded: Bool) {
        let entries = Array(entries)
        var last: [String: Int] = [:]
        if entries.count > 1 {
            for (index, entry) in entries.enumerated() { last[entry.requestID] = index }
        }
        for (index, entry) in entries.enumerated() where last.isEmpty || last[entry.requestID] == index {
            append(entry, checked: !decoded)
        }
    }

    public var count: Int { settled.count + values.count }
    public var isEmpty: Bool { settled.isEmpty && values.isEmpty }
    /// About how many bytes the journal's JSON takes.
    var encodedSizeEstimate: Int { settledJSON.count + 200 * values.count }

    /// Every entry, in wire order (the settled ones decoded: for reading, not for the hot path).
    public var entries: [Entry] { settled.indices.map(decodeSettled) + values }

    /// The entry for `requestID`, if the journal holds one.
    public func entry(requestID: String) -> Entry? {
        if let value = values.last(where: { $0.requestID == requestID }) { return value }
        let hash = requestID.hashValue
        for index in settled.indices.reversed() where settled[index].idHash == hash {
            let entry = decodeSettled(index)
            if entry.requestID == requestID { return entry }
        }
        return nil
    }

    /// Adds `entry` as the user's newest.
    public mutating func append(_ entry: Entry) { append(entry, checked: true) }

    private mutating func append(_ entry: Entry, checked: Bool) {
        guard entry.result != nil else {
            values.append(entry)
            return
        }
        let json = Entry.table.encode(entry)
        // Found later by decoding these bytes: an entry they would not give back stays a value.
        guard !checked || (try? Entry.table.decode(json)) == entry else {
            values.append(entry)
            return
        }
        if !settledJSON.isEmpty { settledJSON.append(UInt8(ascii: ",")) }
        let start = settledJSON.count
        settledJSON.append(contentsOf: json)
        settled.append(
            Settled(
                idHash: entry.requestID.hashValue, start: Int32(start), count: Int32(json.count),
                lastTouchedMs: entry.lastTouchedMs))
    }

    /// Removes every entry of `requestID`.
    public mutating func remove(requestID: String) {
        values.removeAll { $0.requestID == requestID }
        let hash = requestID.hashValue
        guard settled.contains(where: { $0.idHash == hash }) else { return }
        let removed = settled.indices.map { settled[$0].idHash == hash && decodeSettled($0).requestID == requestID }
        keepSettled { !removed[$0] }
    }

    /// Drops results untouched since before `horizonMs`, then the oldest results beyond `cap` (at
    /// least one entry stays). Open intents always stay: a request in flight or in doubt must be
    /// found by a restart however long ago it started. Whether it dropped any.
    @discardableResult
    public mutating func prune(untouchedBefore horizonMs: Int64, cap: Int) -> Bool {
        let counted = count
        if values.contains(where: { $0.result != nil && $0.lastTouchedMs < horizonMs }) {
            values.removeAll { $0.result != nil && $0.lastTouchedMs < horizonMs }
        }
        if settled.contains(where: { $0.lastTouchedMs < horizonMs }) {
            let touched = settled.map(\.lastTouchedMs)
            keepSettled { touched[$0] >= horizonMs }
        }
        var excess = count - max(1, cap)
        guard excess > 0 else { return count < counted }
        // The oldest results first: settled ones in order, a result kept as a value by its time.
        var droppedSettled = 0
        while excess > 0 {
            let value = values.firstIndex { $0.result != nil }
            if droppedSettled < settled.count,
                value.map({ settled[droppedSettled].lastTouchedMs <= values[$0].lastTouchedMs }) ?? true
            {
                droppedSettled += 1
            } else if let value {
                values.remove(at: value)
            } else {
                break
            }
            excess -= 1
        }
        dropOldestSettled(droppedSettled)
        // Open intents are never dropped for the cap: a request in flight or in doubt must be
        // found by a restart (it would be called again as new).
        return count < counted
    }

    /// Removes the oldest `count` settled entries: their bytes go at once, the others move up.
    private mutating func dropOldestSettled(_ count: Int) {
        guard count > 0 else { return }
        guard count < settled.count else {
            settledJSON.removeAll(keepingCapacity: true)
            settled.removeAll(keepingCapacity: true)
            return
        }
        // The next entry's start: the dropped entries and the comma after them.
        let cut = settled[count].start
        settledJSON.removeSubrange(0..<Int(cut))
        settled.removeFirst(count)
        for index in settled.indices { settled[index].start -= cut }
    }

    /// Keeps the settled entries whose index `isKept` picks, in order.
    private mutating func keepSettled(_ isKept: (Int) -> Bool) {
        var json: [UInt8] = []
        json.reserveCapacity(settledJSON.count)
        var kept: [Settled] = []
        kept.reserveCapacity(settled.count)
        for index in settled.indices where isKept(index) {
            var place = settled[index]
            if !json.isEmpty { json.append(UInt8(ascii: ",")) }
            let start = json.count
            json.append(contentsOf: settledJSON[Int(place.start)..<Int(place.start + place.count)])
            place.start = Int32(start)
            kept.append(place)
        }
        settledJSON = json
        settled = kept
    }

    private func decodeSettled(_ index: Int) -> Entry {
        let place = settled[index]
        do {
            return try Entry.table.decode(settledJSON[Int(place.start)..<Int(place.start + place.count)])
        } catch {
            // `append` decoded these very bytes: they cannot fail now.
            preconditionFailure("a journal entry's own JSON no longer decodes: \(error)")
        }
    }
}

extension RequestJournal: FieldValue {
    static var defaultRule: Int { Entry.maximumCount }

    static func read(_ key: String, from reader: JSONFieldReader, _ maxItems: Int) throws(EventValidationError)
        -> Self?
    {
        try [Entry].read(key, from: reader, maxItems).map { Self($0, decoded: true) }
    }

    static func scan(_ scanner: inout JSONScanner, _ maxItems: Int) -> Self? {
        [Entry].scan(&scanner, maxItems).map { Self($0, decoded: true) }
    }

    func write(to writer: inout JSONWriter, _ maxItems: Int) {
        writer.beginArray()
        writer.encodedValues(settledJSON)
        let table = Entry.table
        values.withUnsafeBufferPointer { items in
            for index in items.indices { table.write(at: items.baseAddress! + index, to: &writer) }
        }
        writer.endArray()
    }

    static func shape(_ maxItems: Int) -> FieldShape { [Entry].shape(maxItems) }
}
