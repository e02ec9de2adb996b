import EncoreEvents
import EncoreTools
import Foundation
import TestSupport
import Testing

/// `dead-letters list` and `redrive` against the real binary on the embedded broker.
@Suite("dead-letters: list and redrive")
struct DeadLettersTests {
    @Test("list filters by stage; redrive is a dry run until --execute; redriving twice calls nothing twice")
    func listAndRedrive() async throws {
        let (broker, bootstrap) = try await startBroker()
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.users = 50
        options.seed = 31
        options.invalidRatio = 0.2
        let produced = try await produceRequests(bootstrap: bootstrap, count: 200, options: options)
        let valid = produced.filter { $0.kind == .valid }.count
        let invalid = produced.count - valid
        let arguments = [
            "run", "--bootstrap-servers", bootstrap, "--group-id", "dead-letters", "--controller", "simulated",
            "--simulated-latency-ms", "0",
            "--simulated-outcomes", "purchased=0.7,error=0.3", "--log-level", "warning",
        ]
        var processor = try ChildProcess(try processorBinary(), arguments)
        func outcomes() async throws -> [PurchaseOutcomeEvent] {
            try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes).map {
                try PurchaseOutcomeEvent(jsonBytes: $0.value)
            }
        }
        #expect(try await eventually(timeout: .seconds(90)) { try await outcomes().count == valid })
        let failed = try await outcomes().filter { $0.result == .failed }.count
        #expect(failed > 0)
        #expect(
            try await eventually(timeout: .seconds(180)) {
                try await recordCount(bootstrap: bootstrap, topic: Topics.deadLetters) == Int64(invalid + failed)
            })

        let (status, listed, _) = try await runBinary([
            "dead-letters", "list", "--bootstrap-servers", bootstrap, "--stage", "controller", "--json",
        ])
        #expect(status == 0)
        let lines = listed.split(separator: "\n")
        #expect(lines.count == failed)
        #expect(lines.allSatisfy { $0.contains("\"stage\":\"controller\"") && $0.contains("\"dead_letter\":{") })
        let (_, all, _) = try await runBinary(["dead-letters", "list", "--bootstrap-servers", bootstrap])
        #expect(all.split(separator: "\n").count == invalid + failed)

        // A dry run produces nothing.
        let requestsBefore = try await recordCount(bootstrap: bootstrap, topic: Topics.requests)
        let (dryStatus, plan, _) = try await runBinary([
            "dead-letters", "redrive", "--bootstrap-servers", bootstrap, "--stage", "controller",
        ])
        #expect(dryStatus == 0 && plan.split(separator: "\n").allSatisfy { $0.hasPrefix("would produce") })
        #expect(try await recordCount(bootstrap: bootstrap, topic: Topics.requests) == requestsBefore)

        // Redriven twice, the processor restarted in between (so only the changelog remembers):
        // the records go back, and the journal answers them (no call, no outcome).
        for round in 1...2 {
            if round == 2 {
                #expect(
                    try await eventually(timeout: .seconds(180)) {
                        try await committedOffsets(bootstrap: bootstrap, group: "dead-letters", topic: Topics.requests)
                            .values.reduce(0, +) == requestsBefore + Int64(failed)
                    })
                processor.signal(SIGTERM)
                #expect(await processor.waitForExit() == 0)
                processor = try ChildProcess(try processorBinary(), arguments)
            }
            let (redriven, _, stderr) = try await runBinary([
                "dead-letters", "redrive", "--bootstrap-servers", bootstrap, "--stage", "controller", "--execute",
            ])
            #expect(redriven == 0, "\(stderr)")
            #expect(
                try await recordCount(bootstrap: bootstrap, topic: Topics.requests)
                    == requestsBefore + Int64(round * failed))
        }
        let everything = requestsBefore + Int64(2 * failed)
        #expect(
            try await eventually(timeout: .seconds(180)) {
                try await committedOffsets(bootstrap: bootstrap, group: "dead-letters", topic: Topics.requests).values
                    .reduce(0, +) == everything
            })
        #expect(try await outcomes().count == valid, "a redriven request was answered again")
        #expect(try await recordCount(bootstrap: bootstrap, topic: Topics.deadLetters) == Int64(invalid + failed))
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
    }
}
