import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

@Suite("The real binary: crash and graceful stop", .serialized)
struct ProcessLifecycleTests {
    @Test("SIGKILL mid-run, restart on the same group: every request has an outcome")
    func crashSafety() async throws {
        let (broker, bootstrap) = try await startBroker()
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.users = 1000
        options.seed = 11
        let produced = try await produceRequests(bootstrap: bootstrap, count: 20_000, options: options)
        let ids = Set(produced.compactMap(\.requestID))
        let arguments = [
            "run", "--bootstrap-servers", bootstrap, "--group-id", "crash", "--controller", "simulated",
            "--simulated-outcomes", "purchased=1",
            "--max-in-flight", "50", "--log-level", "warning",
            // The killed member must leave the group quickly for the restart to get its partitions.
            "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500",
        ]
        let first = try ChildProcess(try processorBinary(), arguments + ["--simulated-latency-ms", "20"])
        let someDone = try await eventually(timeout: .seconds(90)) {
            try await recordCount(bootstrap: bootstrap, topic: Topics.outcomes) >= 3000
        }
        #expect(someDone, "\(first.stderr.suffix(2000))")
        first.signal(SIGKILL)
        #expect(await first.waitForExit() != nil)
        let beforeRestart = try await recordCount(bootstrap: bootstrap, topic: Topics.outcomes)
        #expect(beforeRestart < Int64(ids.count), "the first run should not have finished")

        let second = try ChildProcess(try processorBinary(), arguments + ["--simulated-latency-ms", "0"])
        let allDone = try await eventually(timeout: .seconds(120)) {
            try await recordCount(bootstrap: bootstrap, topic: Topics.outcomes) >= Int64(ids.count)
        }
        #expect(allDone, "\(second.stderr.suffix(2000))")
        // Wait until the committed offsets reach the end, then stop cleanly.
        let committedAll = try await eventually(timeout: .seconds(180)) {
            let committed = try await committedOffsets(bootstrap: bootstrap, group: "crash", topic: Topics.requests)
            return committed.values.reduce(0, +) == Int64(produced.count)
        }
        #expect(committedAll)
        second.signal(SIGTERM)
        #expect(await second.waitForExit() == 0, "\(second.stderr.suffix(2000))")

        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes).map {
            try PurchaseOutcomeEvent(jsonBytes: $0.value)
        }
        let answered = Set(outcomes.map(\.requestID))
        #expect(answered == ids, "missing: \(ids.subtracting(answered).count)")
        // A request repeats only when the SIGKILL fell between its outcome's delivery and its result's
        // changelog record: the restart found its intent and called it again as a recovery call
        // (more attempts), and the simulated store answered what it had done. A request whose result
        // was recorded is never answered again.
        let repeated = Dictionary(grouping: outcomes, by: \.requestID).filter { $0.value.count > 1 }
        let disagreeing = repeated.filter { _, answers in
            Set(answers.map { "\($0.result) \($0.controller ?? "") \($0.error?.type ?? "")" }).count > 1
        }
        #expect(disagreeing.isEmpty, "requests answered differently: \(disagreeing.keys.sorted().prefix(5))")
        let undeclared = repeated.filter { _, answers in
            answers.count != 2 || answers[1].attempts <= answers[0].attempts
        }
        #expect(undeclared.isEmpty, "answered again without a recovery: \(undeclared.keys.sorted().prefix(5))")
        await broker.stop()
    }

    @Test("SIGTERM under load: exit 0, every request the controller saw has an outcome")
    func gracefulStop() async throws {
        let (broker, bootstrap) = try await startBroker()
        defer { Task { await broker.stop() } }
        let (billing, port, log) = try await startFakeBilling(delayMs: 30)
        defer { Task { await billing.stop() } }
        var options = RequestGenerator.Options()
        options.users = 2000
        options.seed = 12
        let produced = try await produceRequests(bootstrap: bootstrap, count: 8000, options: options)

        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "graceful", "--controller", "http",
                "--controller-url", "billing=http://127.0.0.1:\(port)/purchase", "--route", "*=billing",
                "--max-in-flight", "40", "--retry-backoff-ms", "10", "--log-level", "info",
            ])
        let underLoad = try await eventually(timeout: .seconds(90)) {
            try await recordCount(bootstrap: bootstrap, topic: Topics.outcomes) >= 500
        }
        #expect(underLoad, "\(processor.stderr.suffix(3000))")
        processor.signal(SIGTERM)
        let status = await processor.waitForExit(timeout: .seconds(300))
        #expect(status == 0, "\(processor.stderr.suffix(3000))")

        let lines = try String(contentsOf: log, encoding: .utf8).split(separator: "\n")
        let called = Set(lines.map { String($0.split(separator: " ")[0]) })
        // Each attempt of each request reached billing once (a retry after 503 is attempt 2).
        let attempts = Dictionary(grouping: lines, by: { $0.split(separator: " ").prefix(2).joined(separator: " ") })
        let repeated = attempts.filter { $0.value.count > 1 }.keys.sorted()
        #expect(repeated.isEmpty, "attempts called more than once: \(repeated.prefix(10))")
        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes).map {
            try PurchaseOutcomeEvent(jsonBytes: $0.value)
        }
        let answered = Set(outcomes.map(\.requestID))
        #expect(!called.isEmpty && called.count < produced.count, "the stop should land mid-run")
        // No crash: nothing is answered twice.
        #expect(outcomes.count == answered.count, "\(outcomes.count - answered.count) repeated outcomes")
        #expect(
            called.subtracting(answered).isEmpty,
            "called without outcome: \(called.subtracting(answered).sorted().prefix(10))")
        // The billing service answered 503 to first attempts of ids ending in 7: those were retried.
        let retried = outcomes.filter { $0.requestID.hasSuffix("7") }
        #expect(!retried.isEmpty && retried.allSatisfy { $0.attempts == 2 && $0.result == .purchased })
        let unexpected = outcomes.filter { !$0.requestID.hasSuffix("7") && $0.attempts != 1 }
        #expect(unexpected.isEmpty, "\(unexpected.prefix(3)) \(processor.stderr.suffix(3000))")
        // Committed offsets never cover a request without an outcome.
        let committed = try await committedOffsets(bootstrap: bootstrap, group: "graceful", topic: Topics.requests)
        let requests = try await readTopic(bootstrap: bootstrap, topic: Topics.requests)
        for message in requests where message.offset < committed[message.partition] ?? 0 {
            let event = try PurchaseRequestEvent(jsonBytes: message.value)
            #expect(answered.contains(event.requestID), "committed past \(event.requestID) without an outcome")
        }
        #expect(committed.values.contains { $0 > 0 }, "nothing was committed: \(committed)")
        // The produced outcomes validate against the schema.
        #expect(try await validateWithPython("purchase-outcome", outcomes.map { $0.jsonBytes() }) == nil)
        await billing.stop()
        await broker.stop()
    }
}
