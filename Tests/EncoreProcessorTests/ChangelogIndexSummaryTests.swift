import EncoreEvents
import Testing

@testable import EncoreProcessor

/// The state store's index facts read by a scan of the record's JSON are the facts the decoded
/// record gives: the open-request index and the expiry index a rebuild writes depend on it.
@Suite("Changelog index summary")
struct ChangelogIndexSummaryTests {
    /// What the decoded record says (the store's rule before the scan).
    private func decodedJournal(_ bytes: [UInt8]) throws -> ChangelogIndexSummary {
        ChangelogIndexSummary(hasOpenRequest: try JournalRecord(jsonBytes: bytes).entry.result == nil)
    }

    private func decodedState(_ bytes: [UInt8]) throws -> ChangelogIndexSummary {
        let state = try EntitlementStateRecord(jsonBytes: bytes)
        return ChangelogIndexSummary(
            hasOpenRequest: state.requests.contains { $0.result == nil },
            earliestExpiryMs: EntitlementLedger.earliestExpiry(of: state, after: .min))
    }

    private func scanned(_ bytes: [UInt8], state: Bool) -> ChangelogIndexSummary? {
        bytes.withUnsafeBufferPointer { state ? ChangelogIndexSummary.state($0) : ChangelogIndexSummary.journal($0) }
    }

    private func entry(_ index: Int, open: Bool, escaped: Bool) -> EntitlementStateRecord.RequestEntry {
        EntitlementStateRecord.RequestEntry(
            requestID: "req-\(index)", attempts: 1 + index % 3, startedAtMs: 1_000 + Int64(index),
            result: open ? nil : OutcomeResult.allCases[index % OutcomeResult.allCases.count],
            completedAtMs: open ? nil : 2_000,
            error: escaped
                ? PurchaseOutcomeEvent.Failure(type: "billing", message: "said \"no\" \\ [{,}]", retryable: false)
                : nil,
            controller: "http", offset: Int64(index), digest: nil)
    }

    @Test("journal records: open exactly when the decoded entry has no result")
    func journalRecords() throws {
        for index in 0..<40 {
            let record = JournalRecord(
                appID: "app", appUserID: "user-\(index)", seq: Int64(index),
                entry: entry(index, open: index % 3 == 0, escaped: index % 4 == 1))
            let bytes = record.jsonBytes()
            let summary = try #require(scanned(bytes, state: false), "\(String(decoding: bytes, as: UTF8.self))")
            #expect(summary == (try decodedJournal(bytes)), "\(String(decoding: bytes, as: UTF8.self))")
            #expect(summary.hasOpenRequest == (index % 3 == 0))
        }
    }

    @Test("state records: the decoded record's open requests and earliest expiry, sources after updated_at_ms only")
    func stateRecords() throws {
        var expiries: Set<Int64?> = []
        var opens: Set<Bool> = []
        for index in 0..<200 {
            let grants = (0..<(index % 4)).map { g in
                EntitlementStateRecord.Grant(
                    productID: "p\(g)", entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days),
                    status: .verified, isActive: (index + g) % 3 != 0, grantedAtMs: 1,
                    expiresAtMs: (index + g) % 5 == 0 ? nil : 10_000 - Int64(index * 7 + g * 13), requestID: "r\(g)",
                    campaignID: g == 1 ? "camp \"x\"" : nil)
            }
            let sources = (0..<(index % 3)).map { s in
                EntitlementStateRecord.Source(
                    source: "revenuecat", entitlementID: "pro\(s)", isActive: (index + s) % 4 != 1,
                    // Some before the state's update (not counted), some after.
                    expiresAtMs: (index + s) % 6 == 0 ? nil : 4_000 + Int64((index * 31 + s * 17) % 4_000),
                    eventID: "e\(s)", occurredAtMs: 3)
            }
            let requests = (0..<(index % 5)).map { r in entry(r, open: (index + r) % 7 == 0, escaped: r == 2) }
            let record = EntitlementStateRecord(
                appID: "app", appUserID: "user-\(index)", sequence: Int64(index), updatedAtMs: 6_000,
                grants: grants, sources: sources, access: index % 2 == 0 ? ["pro": true] : [:], requests: requests)
            let bytes = record.jsonBytes()
            let summary = try #require(scanned(bytes, state: true), "\(String(decoding: bytes, as: UTF8.self))")
            let decoded = try decodedState(bytes)
            #expect(summary == decoded, "\(String(decoding: bytes, as: UTF8.self))")
            expiries.insert(decoded.earliestExpiryMs)
            opens.insert(decoded.hasOpenRequest)
        }
        // The generated records cover the cases: no expiry, many expiries, open and not.
        #expect(expiries.contains(nil) && expiries.count > 20)
        #expect(opens == [true, false])
    }

    @Test("other JSON shapes: whitespace, any field order, unknown fields, nulls")
    func shapes() throws {
        let state = """
             { "sources" : [ {"is_active": true, "expires_at_ms": 900, "x": [1, -2.5e3, {"y": null}]},
               {"expires_at_ms": 50, "is_active": true} ],
              "updated_at_ms" : 100, "grants": [{"expires_at_ms": null, "is_active": true},
               {"is_active": false, "expires_at_ms": 10}, {"is_active": true, "expires_at_ms": 700}],
              "requests": [{"request_id": "a\\"b", "result": "purchased"}, {"result": null}], "z": "\\\\" }
            """
        #expect(
            scanned(Array(state.utf8), state: true)
                == ChangelogIndexSummary(hasOpenRequest: true, earliestExpiryMs: 700))
        #expect(scanned(Array(#"{"result": "failed", "x": true}"#.utf8), state: false)?.hasOpenRequest == false)
        #expect(scanned(Array(#"{"request_id": "r", "result": null}"#.utf8), state: false)?.hasOpenRequest == true)
        #expect(scanned(Array(#"{"request_id": "r"}"#.utf8), state: false)?.hasOpenRequest == true)
        // Not JSON, or an expiry that is not a plain integer: no summary (the record is decoded).
        #expect(scanned(Array(#"{"request_id": "r""#.utf8), state: false) == nil)
        #expect(scanned(Array(#"[1]"#.utf8), state: true) == nil)
        #expect(scanned(Array(#"{"grants": [{"is_active": true, "expires_at_ms": -5}]}"#.utf8), state: true) == nil)
        #expect(scanned(Array(#"{"a": 1} x"#.utf8), state: false) == nil)
    }
    @Test("a field the summary reads given twice: no summary, the record is decoded (which takes the last)")
    func repeatedFields() throws {
        let journal =
            #"{"app_id":"app","app_user_id":"u","journal_seq":1,"request_id":"r","attempts":1,"started_at_ms":1,"result":"purchased","result":null}"#
        #expect(scanned(Array(journal.utf8), state: false) == nil)
        // What the store indexes then: the decoder's answer (the last `result`: open).
        #expect(StateStore.journalSummary(Array(journal.utf8)) == (try decodedJournal(Array(journal.utf8))))
        let state =
            #"{"app_id":"app","app_user_id":"u","sequence":0,"updated_at_ms":0,"grants":[{"product_id":"p","entitlement":{"type":"free_trial","value":7,"unit":"days"},"status":"verified","is_active":true,"granted_at_ms":1,"expires_at_ms":50,"expires_at_ms":null,"request_id":"r"}],"sources":[],"access":[]}"#
        #expect(scanned(Array(state.utf8), state: true) == nil)
        #expect(StateStore.stateSummary(Array(state.utf8)) == (try? decodedState(Array(state.utf8))))
        for repeated in [
            #""updated_at_ms":5,"updated_at_ms":6"#, #""grants":[],"grants":[]"#, #""requests":[],"requests":[]"#,
        ] {
            #expect(scanned(Array("{\(repeated)}".utf8), state: true) == nil, "\(repeated)")
        }
        #expect(scanned(Array(#"{"requests":[{"result":"failed","result":null}]}"#.utf8), state: true) == nil)
    }

}
