import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

@testable import encore_processor

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

    @Test("a range is planned past a short watermark: to the end-of-partition, and past a start found by time")
    func planPastShortWatermarks() {
        // Partition 0 ends (the broker says) at 5, its records go on to 7; the start by time, 6, is
        // past that end.
        let marks: [Int32: (low: Int64, high: Int64)] = [0: (0, 5), 1: (2, 9)]
        let byTime = ReplayCommand.Plan.make(
            marks: marks, starts: [0: (6, true), 1: (4, true)], stops: nil, cutoff: 0)
        #expect(byTime.starts == [0: 6, 1: 4] && byTime.ends == [0: 7, 1: 9] && byTime.exact.isEmpty)
        // Given offsets are no record known: read from them to the end-of-partition, at least to
        // the watermark; a start below the low watermark moves up to it.
        let byOffsets = ReplayCommand.Plan.make(
            marks: marks, starts: [0: (0, false), 1: (0, false)], stops: nil, cutoff: 0)
        #expect(byOffsets.starts == [0: 0, 1: 2] && byOffsets.ends == [0: 5, 1: 9])
        // --to: where a record at or after it exists, the range ends exactly there; where none
        // does, the partition is read to its end, records at or after the time skipped.
        let bounded = ReplayCommand.Plan.make(
            marks: marks, starts: [0: (0, false), 1: (4, true)], stops: [0: 3, 1: nil], cutoff: 1_000)
        #expect(bounded.exact == [0: 0..<3] && bounded.starts == [1: 4] && bounded.ends == [1: 9])
        #expect(bounded.cutoff == 1_000)
    }

    @Test(
        "the copy reads past a short watermark: every record of the range reaches the shadow topic, none written after the replay began"
    )
    func copyPastShortWatermarks() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 2)
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.seed = 63
        let produced = try await produceRequests(bootstrap: bootstrap, count: 40, options: options)
        let kafka = KafkaConfiguration(["bootstrap.servers": bootstrap])
        let admin = try KafkaAdmin(configuration: kafka)
        var marks: [Int32: (low: Int64, high: Int64)] = [:]
        for partition in Int32(0)..<2 {
            let real = try await admin.watermarks(of: KafkaTopicPartition(topic: Topics.requests, partition: partition))
            try #require(real.high > 3)
            // What Tansu reports: the end short of the last batch's other records.
            marks[partition] = (real.low, real.high - 3)
        }
        // The replay begins: records written from now on are not part of its range.
        let began = Int64(Date().timeIntervalSince1970 * 1000)
        let plan = ReplayCommand.Plan.make(
            marks: marks, starts: [0: (0, false), 1: (0, false)], stops: nil, cutoff: began + 1)
        while Int64(Date().timeIntervalSince1970 * 1000) <= began + 1 { await Task.yield() }
        options.seed = 64
        _ = try await produceRequests(bootstrap: bootstrap, count: 10, options: options)
        let copied = try await ReplayCommand.copy(
            plan, from: Topics.requests, to: "replayed.shadow", kafka: kafka, timeout: .seconds(120))
        #expect(copied.records == produced.count, "every record read, past the short ends, none written later")
        #expect(try await recordCount(bootstrap: bootstrap, topic: "replayed.shadow", partitions: 2) == 40)
        #expect(copied.requestIDs.count == Set(produced.compactMap(\.requestID)).count)
    }
}
