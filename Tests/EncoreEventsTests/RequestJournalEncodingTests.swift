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
        entries.removeAll { $0.lastTouchedMs < horizon }
        while entries.count > max(1, cap) {
            entries.remove(at: entries.firstIndex { $0.result != nil } ?? entries.startIndex)
        }
    }

    @Test("prunes what a plain list prunes: past the retention, then the oldest results beyond the cap")
    func pruneAgreesWithAPlainList() {
        var generator = SystemRandomNumberGenerator()
        for round in 0..<200 {
            var plain: [Entry] = []
            var journal = RequestJournal()
            var next = 0
            for _ in 0..<Int.random(in: 1...40, using: &generator) {
                let ms = Int64.random(in: 0...10_000, using: &generator)
                let entry = Bool.random(using: &generator) ? Self.settled(next, at: ms) : Self.intent(next, at: ms)
                next += 1
                plain.append(entry)
                journal.append(entry)
                if Int.random(in: 0..<4, using: &generator) == 0 {
                    let horizon = Int64.random(in: 0...3_000, using: &generator)
                    let cap = Int.random(in: 0...12, using: &generator)
                    Self.plainPrune(&plain, horizon: horizon, cap: cap)
                    journal.prune(untouchedBefore: horizon, cap: cap)
                }
                // The same entries, in the journal's order: settled ones first.
                let expected = plain.filter { $0.result != nil } + plain.filter { $0.result == nil }
                guard journal.entries == expected, Self.journalJSON(journal) == Self.plainJSON(expected) else {
                    Issue.record(
                        "round \(round): \(journal.entries.map(\.requestID)) against \(expected.map(\.requestID))")
                    return
                }
            }
        }
    }

    @Test("equal entries make equal journals, however they were built")
    func equality() {
        var built = RequestJournal([Self.settled(0), Self.settled(1), Self.settled(2)])
        built.prune(untouchedBefore: 0, cap: 2)
        #expect(built == RequestJournal([Self.settled(1), Self.settled(2)]))
        #expect(built != RequestJournal([Self.settled(2), Self.settled(1)]))
    }
}
