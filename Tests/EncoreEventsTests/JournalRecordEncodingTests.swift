import Testing

@testable import EncoreEvents

/// The journal record's hand-written encoder against its field table, which the decoder, the
/// fast path and the schema agreement read: the same bytes for every shape a record takes.
@Suite("Journal record encoding")
struct JournalRecordEncodingTests {
    @Test(
        "2,000 records, each optional field present or absent, errors with escapes and past their limits: the table's bytes, and they decode back"
    )
    func sameBytesAsTheTable() throws {
        var random = RequestJournalEncodingTests.SplitMix64(state: 41)
        func maybe<T>(_ value: T) -> T? { Bool.random(using: &random) ? value : nil }
        let messages = [
            "card declined", "quote \" and backslash \\ and\nnewline\t", String(repeating: "é", count: 1500),
        ]
        for step in 0..<2_000 {
            let error = maybe(
                PurchaseOutcomeEvent.Failure(
                    type: ["", "billing.declined", String(repeating: "t", count: 200)][step % 3],
                    message: messages[Int(random.next() % 3)], retryable: Bool.random(using: &random)))
            let entry = EntitlementStateRecord.RequestEntry(
                requestID: "req-\(step)-\u{1F600}", attempts: Int(random.next() % 5),
                startedAtMs: Int64(random.next() % 2_000_000_000_000),
                result: maybe(OutcomeResult.allCases[step % OutcomeResult.allCases.count]),
                completedAtMs: maybe(Int64(step) * 1_000 + 7), error: error, controller: maybe("stripe"),
                offset: maybe(Int64(random.next() % 1_000_000)), inDoubtSinceMs: maybe(Int64(step) * 3),
                digest: maybe(String(format: "%016llx", random.next())))
            let record = JournalRecord(
                appID: "app_\(step % 7)", appUserID: "user \"\(step)\"", seq: Int64(random.next() % 10_000),
                entry: entry)
            let bytes = record.jsonBytes()
            #expect(bytes == JournalRecord.table.encode(record), "record \(step)")
            // What a restart reads: the record again, the error as it was written.
            var written = record
            if let error = record.entry.error {
                written.entry.error = PurchaseOutcomeEvent.Failure(
                    type: error.wireType, message: error.wireMessage, retryable: error.retryable)
            }
            #expect(try JournalRecord(jsonBytes: bytes) == written, "record \(step)")
        }
    }

    @Test("a record with every field set writes every field its table (and schema) names")
    func everyField() {
        let record = JournalRecord(
            appID: "app", appUserID: "u", seq: 3,
            entry: EntitlementStateRecord.RequestEntry(
                requestID: "r", attempts: 2, startedAtMs: 1, result: .notAttempted, completedAtMs: 2,
                error: PurchaseOutcomeEvent.Failure(type: "t", message: "m", retryable: false), controller: "c",
                offset: 4, inDoubtSinceMs: 5, digest: "00242ac242a9de95"))
        let written = String(decoding: record.jsonBytes(), as: UTF8.self)
        for field in JournalRecord.table.schema {
            #expect(written.contains("\"\(field.name)\":"), "\(field.name) in \(written)")
        }
        #expect(written.contains("\"result\":\"not_attempted\""))
    }

    @Test("a record's changelog key is ':{journal_seq % slots}:{app_id}:{app_user_id}', slots of 1 to 19 digits")
    func keys() {
        var cases: [(seq: Int64, slots: Int)] = [(0, 1), (7, 1), (Int64.max - 1, Int.max), (Int64.max, Int.max)]
        var power: Int64 = 1
        for _ in 0...18 {
            cases += [(power - 1, Int.max), (power, Int.max), (power * 3 + 1, 4096)]
            if power <= Int64.max / 10 { power *= 10 }
        }
        for (seq, slots) in cases {
            let record = JournalRecord(
                appID: "app", appUserID: "u:1", seq: seq,
                entry: EntitlementStateRecord.RequestEntry(requestID: "r", attempts: 1, startedAtMs: 0))
            #expect(record.key(slotCount: slots) == Array(":\(seq % Int64(slots)):app:u:1".utf8), "seq \(seq)")
        }
    }
}
