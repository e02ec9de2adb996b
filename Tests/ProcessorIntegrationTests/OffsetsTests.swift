import EncoreTools
import Foundation
import TestSupport
import Testing

/// `offsets show|reset` against the real binary on the embedded broker. (The mock cannot describe
/// groups, so `--execute` is refused there; `scripts/ci-tansu.sh` applies a reset on Tansu.)
@Suite("offsets: show and reset")
struct OffsetsTests {
    @Test("show gives the committed offsets; a reset is a plan until --execute, which fails closed on the mock")
    func showAndReset() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 2)
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.seed = 51
        let produced = try await produceRequests(bootstrap: bootstrap, count: 60, options: options)
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "moved", "--controller", "simulated",
                "--simulated-latency-ms", "0",
                "--log-level", "warning",
            ])
        #expect(
            try await eventually(timeout: .seconds(90)) {
                try await committedOffsets(bootstrap: bootstrap, group: "moved", topic: Topics.requests, partitions: 2)
                    .values.reduce(0, +) == Int64(produced.count)
            })
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
        let committed = try await committedOffsets(
            bootstrap: bootstrap, group: "moved", topic: Topics.requests, partitions: 2)

        let (shown, table, _) = try await runBinary([
            "offsets", "show", "--group", "moved", "--bootstrap-servers", bootstrap,
        ])
        #expect(shown == 0)
        for partition in Int32(0)..<2 {
            let end = committed[partition]!
            #expect(table.contains("\n\(partition)  \(end)  \(end)  0"), "\(table)")
        }

        let (planned, plan, notes) = try await runBinary([
            "offsets", "reset", "--group", "moved", "--bootstrap-servers", bootstrap, "--shift-by", "-5",
        ])
        #expect(planned == 0, "\(notes)")
        for partition in Int32(0)..<2 {
            let end = committed[partition]!
            #expect(plan.contains("\(Topics.requests)  \(partition)  \(end)  \(max(0, end - 5))"), "\(plan)")
        }
        #expect(notes.contains("dry run"))
        let (earliest, toZero, _) = try await runBinary([
            "offsets", "reset", "--group", "moved", "--bootstrap-servers", bootstrap, "--to-earliest",
        ])
        #expect(earliest == 0 && toZero.contains("\(Topics.requests)  0  \(committed[0]!)  0"))

        let (executed, _, refusal) = try await runBinary([
            "offsets", "reset", "--group", "moved", "--bootstrap-servers", bootstrap, "--to-earliest", "--execute",
        ])
        #expect(executed == 1 && refusal.contains("cannot describe consumer groups"), "\(refusal)")
        let after = try await committedOffsets(
            bootstrap: bootstrap, group: "moved", topic: Topics.requests, partitions: 2)
        #expect(after == committed, "a dry run or a refused reset moved the offsets")

        let (usage, _, usageErrors) = try await runBinary([
            "offsets", "reset", "--group", "moved", "--bootstrap-servers", bootstrap, "--to-earliest", "--to-latest",
        ])
        #expect(usage == 2 && usageErrors.contains("exactly one of"))
    }
}

/// `topics list|describe|verify` against the real binary on the embedded broker.
@Suite("topics: list, describe, verify")
struct TopicsTests {
    @Test("list and describe name the topics; verify fails on a missing topic and on what it cannot check")
    func listDescribeVerify() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 3)
        defer { Task { await broker.stop() } }
        let (listed, list, _) = try await runBinary(["topics", "list", "--bootstrap-servers", bootstrap])
        #expect(listed == 0)
        for topic in Topics.all { #expect(list.contains("\(topic)  partitions=3  replication=1"), "\(list)") }
        let (described, description, _) = try await runBinary(["topics", "describe", "--bootstrap-servers", bootstrap])
        #expect(described == 0 && description.contains("\(Topics.state)  partitions=3"), "\(description)")
        let (missing, _, missingErrors) = try await runBinary([
            "topics", "verify", "--bootstrap-servers", bootstrap, "--outcomes-topic", "no.such.topic",
        ])
        #expect(missing == 1 && missingErrors.contains("'no.such.topic' does not exist"), "\(missingErrors)")
        let (wrong, _, wrongErrors) = try await runBinary([
            "topics", "verify", "--bootstrap-servers", bootstrap, "--partitions", "4",
        ])
        #expect(wrong == 1 && wrongErrors.contains("has 3 partitions, not 4"), "\(wrongErrors)")
        let (replicas, _, replicaErrors) = try await runBinary([
            "topics", "verify", "--bootstrap-servers", bootstrap, "--replication-factor", "3",
        ])
        #expect(replicas == 1 && replicaErrors.contains("fewer than 3"), "\(replicaErrors)")
    }
}
