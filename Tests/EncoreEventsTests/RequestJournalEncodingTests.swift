import Testing

@testable import EncoreEvents

/// The request journal keeps settled entries as their JSON: it must write, find and prune exactly
/// what a plain list of entries would.
@Suite("Request journal (settled entries kept encoded)")
struct RequestJournalEncodingTests {
    typealias Entry = EntitlementStateRecord.RequestEntry

    static func settled(_ index: Int, at ms: Int64 = 1_000) -> Entry {
        Entry(
            requestID: "req-\(index)", attempts: 1 + index % 3, startedAtMs: ms, result: .purchased,
            completedAtMs: ms + 5)
    }

    static func intent(_ index: Int, at ms: Int64 = 1_000) -> Entry {
        Entry(requestID: "req-\(index)", attempts: 1, startedAtMs: ms)
    }

    static let decidedFailure = Entry(
        requestID: "req-failed \"quoted\"", attempts: 4, startedAtMs: 900, result: .failed, completedAtMs: 990,
        error: .init(type: "timeout", message: "no answer\nin time", retryable: false), controller: "billing",
        offset: 42)

    /// What the record's `requests` held before the journal: the entries encoded one by one.
    static func plainJSON(_ entries: [Entry]) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginArray()
        for entry in entries { Entry.table.write(entry, to: &writer) }
        writer.endArray()
        return writer.bytes
    }

    static func journalJSON(_ journal: RequestJournal) -> [UInt8] {
        var writer = JSONWriter()
        journal.write(to: &writer, Entry.maximumCount)
        return writer.bytes
    }

    @Test("writes what encoding each entry writes, settled entries first, and reads back equal")
    func wireForm() throws {
        let entries = [Self.settled(0), Self.intent(1), Self.decidedFailure, Self.settled(3), Self.intent(4)]
        let journal = RequestJournal(entries)
        let settledFirst = [entries[0], entries[2], entries[3], entries[1], entries[4]]
        #expect(journal.entries == settledFirst)
        #expect(Self.journalJSON(journal) == Self.plainJSON(settledFirst))
        #expect(Self.journalJSON(RequestJournal()) == Array("[]".utf8))

        let record = EntitlementStateRecord(appID: "app", appUserID: "u", requests: entries)
        let decoded = try EntitlementStateRecord(jsonBytes: record.jsonBytes())
        #expect(decoded == record && decoded.requests == settledFirst)
        // The general decoder builds the same journal as the fast path.
        #expect(try EntitlementStateRecord.table.decodeGeneral(record.jsonBytes()) == record)
    }

    @Test("finds an entry by request id, an intent before a settled entry of the same id")
    func lookup() {
        var journal = RequestJournal((0..<50).map { Self.settled($0) } + [Self.decidedFailure])
        #expect(journal.entry(requestID: "req-17") == Self.settled(17))
        #expect(journal.entry(requestID: Self.decidedFailure.requestID) == Self.decidedFailure)
        #expect(journal.entry(requestID: "req-50") == nil && journal.entry(requestID: "") == nil)
        journal.append(Self.intent(17, at: 2_000))
        #expect(journal.entry(requestID: "req-17") == Self.intent(17, at: 2_000))
        journal.remove(requestID: "req-17")
        #expect(journal.entry(requestID: "req-17") == nil && journal.count == 50)
        let remaining = (0..<50).filter { $0 != 17 }.map { "req-\($0)" } + [Self.decidedFailure.requestID]
        #expect(journal.entries.map(\.requestID) == remaining)
    }

    /// The pruning the journal replaced, on a plain list.
    static func plainPrune(_ entries: inout [Entry], horizon: Int64, cap: Int) {
        // Open intents stay however old: a restart must find them.
        entries.removeAll { $0.result != nil && $0.lastTouchedMs < horizon }
        // Open intents stay whatever the cap: a restart must find a request in flight or in doubt.
        while entries.count > max(1, cap), let oldestResult = entries.firstIndex(where: { $0.result != nil }) {
            entries.remove(at: oldestResult)
        }
    }

    /// A seeded generator: a failing round can be run again.
    struct SplitMix64: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9e37_79b9_7f4a_7c15
            var z = state
            z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
            z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
            return z ^ (z >> 31)
        }
    }

    @Test(
        "appends, removes, finds and prunes what a plain list does: past the retention, then the oldest results, never an open intent for the cap"
    )
    func agreesWithAPlainList() {
        for seed in UInt64(1)...120 {
            var generator = SplitMix64(state: seed)
            var plain: [Entry] = []
            var journal = RequestJournal()
            for _ in 0..<Int.random(in: 1...40, using: &generator) {
                let ms = Int64.random(in: 0...10_000, using: &generator)
                // Ids repeat: an intent settles, a re-sent request comes back.
                let id = Int.random(in: 0..<25, using: &generator)
                let entry = Bool.random(using: &generator) ? Self.settled(id, at: ms) : Self.intent(id, at: ms)
                switch Int.random(in: 0..<6, using: &generator) {
                case 0:
                    plain.removeAll { $0.requestID == entry.requestID }
                    journal.remove(requestID: entry.requestID)
                case 1:
                    let horizon = Int64.random(in: 0...3_000, using: &generator)
                    let cap = Int.random(in: 0...12, using: &generator)
                    let before = plain.count
                    Self.plainPrune(&plain, horizon: horizon, cap: cap)
                    // The ledger counts a state as changed by what prune says it dropped.
                    let dropped = journal.prune(untouchedBefore: horizon, cap: cap)
                    if dropped != (plain.count < before) {
                        Issue.record("seed \(seed): prune said \(dropped), dropped \(before - plain.count)")
                        return
                    }
                default:
                    // As the ledger does: an id's earlier entry goes before its new one.
                    plain.removeAll { $0.requestID == entry.requestID }
                    plain.append(entry)
                    journal.remove(requestID: entry.requestID)
                    journal.append(entry)
                }
                // The same entries, in the journal's order: settled ones first.
                let expected = plain.filter { $0.result != nil } + plain.filter { $0.result == nil }
                let found = (0..<25).map { id in journal.entry(requestID: "req-\(id)") }
                let plainFound = (0..<25).map { id in plain.last { $0.requestID == "req-\(id)" } }
                guard journal.entries == expected, Self.journalJSON(journal) == Self.plainJSON(expected),
                    found == plainFound, journal == RequestJournal(expected)
                else {
                    Issue.record(
                        "seed \(seed): \(journal.entries.map(\.requestID)) against \(expected.map(\.requestID))")
                    return
                }
            }
        }
    }

    @Test("an entry whose JSON does not read back as it is stays a value: found, written, pruned as before")
    func entryThatDoesNotRoundTrip() throws {
        // A controller's error type and message are not checked where they are made: past the
        // contract's limits, the written entry cuts them (and an empty type names no class).
        var long = Self.decidedFailure
        long.error = .init(type: "", message: String(repeating: "x", count: 5_000), retryable: false)
        var journal = RequestJournal([Self.settled(0), long, Self.settled(2)])
        #expect(journal.entry(requestID: long.requestID) == long)
        let record = EntitlementStateRecord(appID: "app", appUserID: "u", requests: journal.entries)
        let decoded = try EntitlementStateRecord(jsonBytes: record.jsonBytes())
        let written = try #require(decoded.journal.entry(requestID: long.requestID)?.error)
        #expect(written.message.count == EventLimits.messageLength && written.type == "unnamed")
        journal.prune(untouchedBefore: 0, cap: 1)
        #expect(journal.entries == [Self.settled(2)], "the oldest results go first, the value among them")
    }

    @Test("a record listing an id twice keeps the last, as a list searched from its end did")
    func duplicateIDs() {
        let older = Self.intent(1, at: 500)
        let journal = RequestJournal([older, Self.settled(1), Self.intent(2), Self.intent(2, at: 3_000)])
        #expect(journal.entry(requestID: "req-1") == Self.settled(1))
        #expect(journal.entry(requestID: "req-2") == Self.intent(2, at: 3_000) && journal.count == 2)
    }

    @Test("equal entries make equal journals, however they were built")
    func equality() {
        var built = RequestJournal([Self.settled(0), Self.settled(1), Self.settled(2)])
        built.prune(untouchedBefore: 0, cap: 2)
        #expect(built == RequestJournal([Self.settled(1), Self.settled(2)]))
        #expect(built != RequestJournal([Self.settled(2), Self.settled(1)]))
    }
}
