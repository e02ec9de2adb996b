import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

#if canImport(FoundationXML)
    import FoundationXML
#endif

/// Whether an HTML report is well-formed (it is XML after its doctype).
func isWellFormed(html: String) -> Bool {
    let body = html.replacingOccurrences(of: "<!DOCTYPE html>", with: "")
    return XMLParser(data: Data(body.utf8)).parse()
}

/// The counts of `audit --json`, by name.
func auditCounts(_ json: String) throws -> [String: Int64] {
    guard case .object(let fields) = try JSONValue.parse(Array(json.utf8)) else {
        throw TestFailure("not JSON: \(json)")
    }
    return fields.compactMapValues { if case .integer(let count) = $0 { count } else { nil } }
}

/// `audit` against the real binary: a processor's clean run, then planted discrepancies.
@Suite("audit: the real binary on the embedded broker")
struct AuditTests {
    @Test("a clean run audits clean (exit 0); five planted discrepancies are found exactly (exit 1)")
    func cleanThenPlanted() async throws {
        let (broker, bootstrap) = try await startBroker()
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.users = 40
        options.seed = 41
        options.invalidRatio = 0.1
        let produced = try await produceRequests(bootstrap: bootstrap, count: 300, options: options)
        let valid = produced.filter { $0.kind == .valid }.count
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "audited", "--controller", "simulated",
                "--simulated-latency-ms", "0",
                "--log-level", "warning",
            ])
        // Everything done: every record's outputs (changelog included) are acknowledged before its commit.
        #expect(
            try await eventually(timeout: .seconds(90)) {
                try await committedOffsets(bootstrap: bootstrap, group: "audited", topic: Topics.requests).values
                    .reduce(0, +) == Int64(produced.count)
            })
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)

        let html = FileManager.default.temporaryDirectory.appendingPathComponent("audit-\(UUID()).html")
        defer { try? FileManager.default.removeItem(at: html) }
        let (cleanStatus, cleanJSON, cleanErrors) = try await runBinary(
            ["audit", "--bootstrap-servers", bootstrap, "--json", "--html", html.path], timeout: .seconds(120))
        #expect(cleanStatus == 0, "\(cleanJSON)\n\(cleanErrors)")
        let clean = try auditCounts(cleanJSON)
        #expect(clean["discrepancies"] == 0)
        #expect(clean["invalid_requests"] == Int64(produced.count - valid))
        #expect(cleanJSON.contains("\"requests\":\(valid),"))
        let page = try String(contentsOf: html, encoding: .utf8)
        #expect(isWellFormed(html: page))
        for id in AuditReport.chartIDs { #expect(page.contains("<svg id=\"\(id)\"")) }

        // Plant five discrepancies.
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        func send(_ topic: String, _ key: String, _ value: [UInt8]) async throws {
            _ = try await producer.send(KafkaProducerRecord(topic: topic, key: Array(key.utf8), value: value))
        }
        // 1. A request produced after the processor stopped: missing.
        let plantedAt = wallClockMs()
        var lateOptions = RequestGenerator.Options()
        lateOptions.seed = 42
        var late = RequestGenerator(options: lateOptions)
        let lateRecord = late.next(nowMs: plantedAt)
        _ = try await producer.send(
            KafkaProducerRecord(topic: Topics.requests, key: lateRecord.key, value: lateRecord.value))
        let lateID = try PurchaseRequestEvent(jsonBytes: lateRecord.value).requestID
        // 2. A purchased outcome contradicted.
        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes).map {
            try PurchaseOutcomeEvent(jsonBytes: $0.value)
        }
        var contradiction = try #require(outcomes.first { $0.result == .purchased })
        contradiction.result = .cancelled
        try await send(Topics.outcomes, contradiction.key, contradiction.jsonBytes())
        // 3. An outcome for no request.
        var orphan = contradiction
        orphan.requestID = "ghost-1"
        orphan.appUserID = "ghost"
        try await send(Topics.outcomes, orphan.key, orphan.jsonBytes())
        // 4. A change published twice.
        let change = try #require(try await readTopic(bootstrap: bootstrap, topic: Topics.entitlements).first)
        try await send(Topics.entitlements, String(decoding: change.key ?? [], as: UTF8.self), change.value)
        // 5. A changelog record that disagrees with the user's changes.
        let states = try await readTopic(bootstrap: bootstrap, topic: Topics.state)
        var latest: [String: EntitlementStateRecord] = [:]
        for record in states where !record.value.isEmpty && !JournalRecord.isJournalKey(record.key) {
            let state = try EntitlementStateRecord(jsonBytes: record.value)
            latest[state.key] = state
        }
        var disagreeing = try #require(latest.values.sorted { $0.key < $1.key }.first { !$0.grants.isEmpty })
        disagreeing.grants[0].isActive.toggle()
        try await send(Topics.state, disagreeing.key, disagreeing.jsonBytes())
        await producer.close()

        let (status, json, errors) = try await runBinary(
            ["audit", "--bootstrap-servers", bootstrap, "--json"], timeout: .seconds(120))
        #expect(status == 1, "\(errors)")
        let counts = try auditCounts(json)
        let expected: [String: Int64] = [
            "missing_outcomes": 1, "conflicting_outcomes": 1, "orphan_outcomes": 1, "sequence_repeats": 1,
            "state_mismatches": 1,
        ]
        for discrepancy in AuditReport.Discrepancy.allCases where discrepancy.isFailure {
            #expect(counts[discrepancy.rawValue] == expected[discrepancy.rawValue] ?? 0, "\(discrepancy.rawValue)")
        }
        #expect(counts["discrepancies"] == 5)
        #expect(json.contains("\"missing_outcomes\":[{\"request_id\":\"\(lateID)\""))
        #expect(json.contains("\"conflicting_outcomes\":[{\"request_id\":\"\(contradiction.requestID)\""))
        #expect(json.contains("\"orphan_outcomes\":[{\"request_id\":\"ghost-1\""))
        #expect(json.contains("\"state_mismatches\":[{\"user\":\"\(disagreeing.key)\""))

        // The range: only the late request is in it.
        let (rangeStatus, ranged, _) = try await runBinary(
            ["audit", "--bootstrap-servers", bootstrap, "--json", "--from", String(plantedAt)], timeout: .seconds(120))
        #expect(rangeStatus == 1)
        #expect(ranged.contains("\"figures\":{\"requests\":1,"))
        #expect(try auditCounts(ranged)["missing_outcomes"] == 1)

        let (usage, _, usageErrors) = try await runBinary(["audit", "--bootstrap-servers", bootstrap, "--from", "soon"])
        #expect(usage == 2 && usageErrors.contains("--from"))
    }
}
