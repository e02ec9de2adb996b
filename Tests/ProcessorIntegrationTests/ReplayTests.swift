import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

/// `replay` and `audit --compare` against the real binary on the embedded broker.
@Suite("replay: the real binary on the embedded broker")
struct ReplayTests {
    /// The latest changelog record of each user of `topic`.
    func latestStates(_ bootstrap: String, _ topic: String) async throws -> [String: EntitlementStateRecord] {
        var latest: [String: EntitlementStateRecord] = [:]
        for record in try await readTopic(bootstrap: bootstrap, topic: topic, partitions: 4)
        where !record.value.isEmpty && !JournalRecord.isJournalKey(record.key) {
            let state = try EntitlementStateRecord(jsonBytes: record.value)
            latest[state.key] = state
        }
        return latest
    }

    func results(_ bootstrap: String, _ topic: String) async throws -> [String: OutcomeResult] {
        var results: [String: OutcomeResult] = [:]
        for record in try await readTopic(bootstrap: bootstrap, topic: topic, partitions: 4) {
            let outcome = try PurchaseOutcomeEvent(jsonBytes: record.value)
            results[outcome.requestID] = outcome.result
        }
        return results
    }

    @Test(
        "recorded: no billing call, production's outcomes and entitlements exactly; a new access rule: exactly the users it changes"
    )
    func recordedThenChangedCatalog() async throws {
        // (The mock creates the shadow topics itself, with 4 partitions: the requests topic has 4.)
        let (broker, bootstrap) = try await startBroker(partitions: 4)
        defer { Task { await broker.stop() } }
        let (billing, port, log) = try await startFakeBilling()
        defer { Task { await billing.stop() } }
        var options = RequestGenerator.Options()
        options.users = 30
        options.seed = 61
        options.invalidRatio = 0.05
        let produced = try await produceRequests(bootstrap: bootstrap, count: 200, options: options)
        let url = "http://127.0.0.1:\(port)/purchase"
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "production", "--controller", "http",
                "--controller-url", url, "--log-level", "warning",
            ])
        #expect(
            try await eventually(timeout: .seconds(90)) {
                try await committedOffsets(
                    bootstrap: bootstrap, group: "production", topic: Topics.requests, partitions: 4
                )
                .values.reduce(0, +) == Int64(produced.count)
            })
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
        let billed = try String(contentsOf: log, encoding: .utf8).split(separator: "\n").count
        #expect(billed > 0)
        let production = try await results(bootstrap, Topics.outcomes)
        let start = "0:0,1:0,2:0,3:0"
        func productionMarks() async throws -> [Int64] {
            var marks: [Int64] = []
            for topic in Topics.all {
                marks.append(try await recordCount(bootstrap: bootstrap, topic: topic, partitions: 4))
            }
            return marks
        }
        let marksBefore = try await productionMarks()
        let offsetsBefore = try await committedOffsets(
            bootstrap: bootstrap, group: "production", topic: Topics.requests, partitions: 4)

        // The environment names the production controller: a replay does not take it.
        let (status, summary, errors) = try await runBinary(
            [
                "replay", "--bootstrap-servers", bootstrap, "--from-offsets", start, "--into", "audit-a", "--json",
                "--log-level", "warning",
            ], environment: ["ENCORE_CONTROLLER": "http", "ENCORE_CONTROLLER_URL": url], timeout: .seconds(120))
        #expect(status == 0, "\(errors)")
        #expect(summary.contains("\"requests\":\(produced.count),"), "\(summary)")
        #expect(summary.contains("\"unrecorded\":0"), "\(summary)")
        #expect(
            try String(contentsOf: log, encoding: .utf8).split(separator: "\n").count == billed,
            "the replay called billing")
        #expect(try await results(bootstrap, "audit-a.purchase-outcomes") == production)
        #expect(try await productionMarks() == marksBefore, "the replay wrote a production topic")
        #expect(
            try await committedOffsets(bootstrap: bootstrap, group: "production", topic: Topics.requests, partitions: 4)
                == offsetsBefore, "the replay moved the production group")
        let (same, sameReport, _) = try await runBinary(
            ["audit", "--bootstrap-servers", bootstrap, "--compare", "audit-a", "--json"], timeout: .seconds(120))
        #expect(same == 0, "\(sameReport)")
        let users = try await latestStates(bootstrap, Topics.state)
        #expect(sameReport.contains("\"compared_users\":\(users.count),\"differing_users\":0"), "\(sameReport)")

        // A new access rule: the users with an active free trial gain 'pro', no one else changes.
        let (changed, _, changeErrors) = try await runBinary(
            [
                "replay", "--bootstrap-servers", bootstrap, "--from-offsets", start, "--into", "audit-b",
                "--access-rule", "pro = encore:freeTrial", "--log-level", "warning",
            ], timeout: .seconds(120))
        #expect(changed == 0, "\(changeErrors)")
        let expected = users.values.filter { state in
            state.grants.contains { $0.isActive && $0.entitlement.type == .freeTrial }
        }.map(\.key).sorted()
        #expect(!expected.isEmpty && expected.count < users.count)
        let (differ, report, _) = try await runBinary(
            ["audit", "--bootstrap-servers", bootstrap, "--compare", "audit-b", "--json"], timeout: .seconds(120))
        #expect(differ == 1)
        guard case .object(let fields) = try JSONValue.parse(Array(report.utf8)),
            case .array(let differences)? = fields["differences"]
        else { throw TestFailure("not a comparison: \(report)") }
        let listed = differences.compactMap { item -> String? in
            guard case .object(let difference) = item, case .string(let user)? = difference["user"] else { return nil }
            return user
        }
        #expect(listed == expected)

        // The same prefix twice, or a prefix naming production's topics, is refused.
        let (again, _, againErrors) = try await runBinary([
            "replay", "--bootstrap-servers", bootstrap, "--from-offsets", start, "--into", "audit-a",
        ])
        #expect(again == 2 && againErrors.contains("already holds records"), "\(againErrors)")
        let (clash, _, clashErrors) = try await runBinary([
            "replay", "--bootstrap-servers", bootstrap, "--from-offsets", start, "--into", "encore",
        ])
        #expect(clash == 2 && clashErrors.contains("would write the production topic"), "\(clashErrors)")
    }
}
