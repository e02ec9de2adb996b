import EncoreEvents
import Foundation
import Kafka
import TestSupport
import Testing

#if canImport(FoundationXML)
    import FoundationXML
#endif

/// The fields of `loadtest --json`.
private func loadTestFields(_ json: String) throws -> [String: JSONValue] {
    guard case .object(let fields) = try JSONValue.parse(Array(json.utf8)) else {
        throw TestFailure("not JSON: \(json)")
    }
    return fields
}

private func integer(_ fields: [String: JSONValue], _ name: String) -> Int64? {
    if case .integer(let value)? = fields[name] { value } else { nil }
}

/// A broker and a processor started apart, as a deployment is; `ready()` waits until a small
/// load test passes (the group is joined, outcomes flow).
private struct Deployment {
    let broker: ChildProcess
    let bootstrap: String
    let processor: ChildProcess

    static func start(group: String, processorArguments: [String] = []) async throws -> Deployment {
        let (broker, bootstrap) = try await startBroker()
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", group, "--controller", "simulated",
                "--log-level", "warning",
            ] + (processorArguments.isEmpty ? ["--simulated-latency-ms", "0"] : processorArguments))
        let deployment = Deployment(broker: broker, bootstrap: bootstrap, processor: processor)
        let (status, output, errors) = try await deployment.loadTest(
            ["--rate", "20", "--duration", "1", "--grace", "60", "--run-id", "warmup"])
        guard status == 0 else { throw TestFailure("warm-up load test: \(status)\n\(output)\n\(errors)") }
        return deployment
    }

    func loadTest(_ arguments: [String]) async throws -> (Int32, String, String) {
        try await runBinary(
            ["loadtest", "--bootstrap-servers", bootstrap, "--users", "50", "--log-level", "warning"] + arguments,
            timeout: .seconds(180))
    }

    func stop() async {
        await processor.stop()
        await broker.stop()
    }

    /// This run's requests and outcomes as the topics hold them.
    func topics(runID: String) async throws -> (requests: [PurchaseRequestEvent], outcomes: [String: Int]) {
        let requests = try await readTopic(bootstrap: bootstrap, topic: Topics.requests).compactMap {
            try? PurchaseRequestEvent(jsonBytes: $0.value)
        }.filter { $0.attributes?["encore_loadtest_run"] == runID }
        var outcomes: [String: Int] = [:]
        for message in try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes) {
            let outcome = try PurchaseOutcomeEvent(jsonBytes: message.value)
            if outcome.requestID.hasPrefix("lt-\(runID)-") { outcomes[outcome.requestID, default: 0] += 1 }
        }
        return (requests, outcomes)
    }
}

/// One deployment at a time per suite: each is a broker, a processor and a load test on a 2-core
/// machine. Two suites, so that two run side by side.
@Suite("loadtest: steady runs, SLOs and errors against a deployment on the embedded broker", .serialized)
struct LoadTestTests {
    @Test("a steady run counts exactly what was produced and answered; HTML and HDR log readable; exit 0")
    func steady() async throws {
        let deployment = try await Deployment.start(
            group: "loaded",
            processorArguments: ["--simulated-latency-ms", "0", "--http-listen", "127.0.0.1:0", "--log-level", "info"])
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("loadtest-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let (html, hdr) = (
            directory.appendingPathComponent("report.html"), directory.appendingPathComponent("run.hlog")
        )
        let (status, output, errors) = try await deployment.loadTest([
            "--rate", "100", "--duration", "6", "--grace", "60", "--window-s", "2", "--run-id", "steady",
            "--duplicate-ratio", "0.05", "--json", "--html", html.path, "--hdr", hdr.path,
        ])
        #expect(status == 0, "\(output)\n\(errors)")
        #expect(!errors.contains("offered "), "--json prints no live lines: \(errors)")
        let fields = try loadTestFields(output)
        let (requests, outcomes) = try await deployment.topics(runID: "steady")
        // Every request the run produced is in the topic, SANDBOX, marked with the run id.
        let sent = try #require(integer(fields, "sent"))
        #expect(sent == 600, "6 s at 100/s")
        #expect(Int64(requests.count) == sent)
        #expect(requests.allSatisfy { $0.environment == .sandbox && $0.requestID.hasPrefix("lt-steady-") })
        let unique = Set(requests.map(\.requestID))
        #expect(integer(fields, "valid_sent") == Int64(unique.count))
        #expect(integer(fields, "duplicates_sent") == Int64(requests.count - unique.count))
        // Every unique request answered once, as the outcomes topic holds them.
        #expect(integer(fields, "answered") == Int64(unique.count))
        #expect(Set(outcomes.keys) == unique)
        #expect(outcomes.values.allSatisfy { $0 == 1 })
        #expect(integer(fields, "missing") == 0 && integer(fields, "duplicate_outcomes") == 0)
        if case .object(let results)? = fields["results"] {
            #expect(
                results.values.reduce(Int64(0)) { if case .integer(let n) = $1 { $0 + n } else { $0 } }
                    == Int64(unique.count))
        } else {
            Issue.record("no results: \(output)")
        }
        // The deployment's metrics and an audit tell the load test's traffic apart (the warm-up's 20 too).
        // One dispatch loop per core unless --workers says otherwise.
        let cores = min(ProcessInfo.processInfo.activeProcessorCount, 64)
        #expect(deployment.processor.stderr.contains("(\(cores) workers, max in flight 256)"))
        let operations = OperationsTests()
        let base = try await operations.endpoint(of: deployment.processor)
        #expect(try await operations.metrics(base)["encore_loadtest_outcomes_total{}"] == Double(unique.count + 20))
        let (auditStatus, audit, auditErrors) = try await runBinary(
            ["audit", "--bootstrap-servers", deployment.bootstrap, "--json"], timeout: .seconds(120))
        #expect(auditStatus == 0, "\(audit)\n\(auditErrors)")
        if case .object(let figures)? = try loadTestFields(audit)["figures"],
            case .object(let runs)? = figures["load_test_requests_by_run"]
        {
            #expect(runs == ["warmup": .integer(20), "steady": .integer(Int64(unique.count))])
        } else {
            Issue.record("no load_test_requests_by_run: \(audit)")
        }
        let page = try String(contentsOf: html, encoding: .utf8)
        #expect(isWellFormed(html: page))
        // Every chart is there and draws something: lines, or the outcome mix's columns. A steady rate
        // has no latency-against-offered-rate chart (its points would share one x).
        #expect(!page.contains("<svg id=\"knee\"") && page.contains("Latency against offered rate is left out"))
        for (chart, mark) in [("rate", "<polyline"), ("latency", "<polyline"), ("outcomes", "<rect")] {
            let svg = page.components(separatedBy: "<svg id=\"\(chart)\"").dropFirst().first?
                .components(separatedBy: "</svg>").first
            #expect(svg?.contains(mark) == true, "chart \(chart)")
        }
        // HdrHistogram's own Python reader decodes every interval: together, every answered request.
        let reader = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"),
            [
                "python3", "-c",
                """
                import sys
                from hdrh.histogram import HdrHistogram
                from hdrh.log import HistogramLogReader
                reader = HistogramLogReader(sys.argv[1], HdrHistogram(1, 3600 * 10**6, 3))
                total = 0
                while (h := reader.get_next_interval_histogram()) is not None:
                    total += h.get_total_count()
                print(total)
                """, hdr.path,
            ])
        #expect(await reader.waitForExit(timeout: .seconds(300)) == 0, "\(reader.stderr)")
        #expect(reader.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == String(unique.count))
        await deployment.stop()
    }

    @Test("a p99 above the SLO fails the run (exit 1); a missing allowance is honoured")
    func sloViolation() async throws {
        let deployment = try await Deployment.start(
            group: "slow", processorArguments: ["--simulated-latency-ms", "40"])
        let (status, output, errors) = try await deployment.loadTest([
            "--rate", "50", "--duration", "3", "--window-s", "1", "--grace", "60", "--run-id", "slo",
            "--slo", "p99=5,missing=0",
        ])
        #expect(status == 1, "\(output)\n\(errors)")
        #expect(output.contains("SLO          FAILED: p99:"), "\(output)")
        #expect(output.contains(", 0 missing,"), "\(output)")
        // The live lines: one per window on standard error.
        #expect(errors.contains("offered 50/s"), "\(errors)")
        let (passing, passed, passingErrors) = try await deployment.loadTest([
            "--rate", "50", "--duration", "2", "--grace", "60", "--run-id", "slo2", "--slo", "p99=60000",
        ])
        #expect(passing == 0, "\(passed)\n\(passingErrors)")
        await deployment.stop()
    }

    @Test("an unreachable cluster is a connection error: exit 2 with the reason, no report")
    func unreachable() async throws {
        let (status, output, errors) = try await runBinary(
            ["loadtest", "--bootstrap-servers", "127.0.0.1:1", "--rate", "10", "--duration", "1", "--json"],
            timeout: .seconds(120))
        #expect(status == 2, "\(output)\n\(errors)")
        #expect(output.isEmpty && errors.contains("loadtest: "), "\(output)\n\(errors)")
    }

}

@Suite("loadtest: a processor stopped half-way, and a ramp's knee", .serialized)
struct LoadTestFailureTests {
    @Test("the processor stopped half-way: the requests without an outcome are reported missing, exit 1")
    func stoppedHalfWay() async throws {
        let deployment = try await Deployment.start(group: "stopped")
        // Outcomes counted from the topic's end offsets, cheap to ask often: reading the topics
        // whole at every poll lagged past the 40 s of production once under the whole suite, and
        // the processor was stopped only after everything was answered.
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(["bootstrap.servers": deployment.bootstrap]))
        let partitions = try #require(try await admin.partitionCount(of: Topics.outcomes))
        func outcomesHeld() async throws -> Int64 {
            var total: Int64 = 0
            for partition in 0..<Int32(partitions) {
                let outcomes = KafkaTopicPartition(topic: Topics.outcomes, partition: partition)
                total += try await admin.watermarks(of: outcomes).high
            }
            return total
        }
        let warmUp = try await outcomesHeld()
        let run = Task {
            try await deployment.loadTest([
                "--rate", "50", "--duration", "40", "--grace", "3", "--run-id", "halfway", "--json",
            ])
        }
        // Stopped once some of the run's requests were answered, well before the 40 s of production end.
        #expect(
            try await eventually(timeout: .seconds(60), poll: .milliseconds(250)) {
                try await outcomesHeld() >= warmUp + 20
            })
        deployment.processor.signal(SIGTERM)
        #expect(await deployment.processor.waitForExit(timeout: .seconds(300)) == 0)
        let stoppedAt = try await deployment.topics(runID: "halfway").requests.count
        let (status, output, errors) = try await run.value
        #expect(status == 1, "\(output)\n\(errors)")
        let fields = try loadTestFields(output)
        let (requests, outcomes) = try await deployment.topics(runID: "halfway")
        let unique = Set(requests.map(\.requestID))
        let missing = unique.subtracting(outcomes.keys).count
        #expect(requests.count > stoppedAt, "requests kept coming after the processor stopped")
        #expect(missing >= requests.count - stoppedAt)
        #expect(integer(fields, "missing") == Int64(missing))
        #expect(integer(fields, "answered") == Int64(outcomes.count))
        #expect(fields["passed"] == .bool(false))
        // With the processor gone every request is missing: within an allowance the run passes.
        let (allowed, allowedOutput, allowedErrors) = try await deployment.loadTest([
            "--rate", "10", "--duration", "1", "--grace", "1", "--run-id", "allowed", "--slo", "missing=10",
        ])
        #expect(allowed == 0, "\(allowedOutput)\n\(allowedErrors)")
        #expect(allowedOutput.contains(", 10 missing,"), "\(allowedOutput)")
        let (beyond, beyondOutput, _) = try await deployment.loadTest([
            "--rate", "10", "--duration", "1", "--grace", "1", "--run-id", "beyond", "--slo", "missing=9",
        ])
        #expect(beyond == 1 && beyondOutput.contains("missing: 10 requests without an outcome"), "\(beyondOutput)")
        await deployment.stop()
    }

    @Test("a ramp past what the deployment answers (10 to 300/s against about 100/s) reports its knee inside the ramp")
    func rampKnee() async throws {
        // About 100 calls a second at most: 2 in flight, 20 ms each. Past it the queue grows by the
        // second (p99 3 s at 130/s offered, 6 s at 180/s); within it a loaded suite still gave 808 ms
        // in the first window once, which an 800 ms bound counted as the knee already passed.
        let deployment = try await Deployment.start(
            group: "ramped", processorArguments: ["--simulated-latency-ms", "20", "--max-in-flight", "2"])
        let (status, output, errors) = try await deployment.loadTest([
            "--ramp", "10:300", "--duration", "12", "--window-s", "2", "--grace", "120", "--run-id", "ramp",
            "--slo", "p99=2000", "--json",
        ])
        let fields = try loadTestFields(output)
        #expect(status == 0, "everything is answered after the grace: \(output)\n\(errors)")
        let knee: Double
        switch fields["knee_rate"] {
        case .double(let value)?: knee = value
        case .integer(let value)?: knee = Double(value)
        default:
            Issue.record("no knee: \(output)")
            return
        }
        #expect(knee >= 10 && knee < 300, "\(output)")
        #expect(fields["knee_reached_end"] == .bool(false))
        // The knee is where the windows' own figures say: every window of production up to it had
        // its requests answered with p99 within 2,000 ms, the next one did not.
        guard case .array(let windows)? = fields["windows"] else {
            Issue.record("no windows: \(output)")
            return
        }
        let production = windows.compactMap { value -> (rate: Double, holds: Bool)? in
            guard case .object(let window) = value, let sent = integer(window, "sent"), sent > 0 else { return nil }
            let rate: Double
            switch window["offered_rate"] {
            case .double(let value)?: rate = value
            case .integer(let value)?: rate = Double(value)
            default: return nil
            }
            let p99: Double
            switch window["p99_ms_of_sent"] {
            case .double(let value)?: p99 = value
            case .integer(let value)?: p99 = Double(value)
            default: return nil
            }
            let answered = integer(window, "answered_of_sent") ?? 0
            return (rate, p99 <= 2000 && answered >= (integer(window, "valid_sent") ?? .max))
        }
        let kneeIndex = try #require(production.firstIndex { $0.rate == knee }, "\(output)")
        let heldUpToKnee = production[...kneeIndex].allSatisfy { $0.holds }
        #expect(heldUpToKnee, "\(output)")
        #expect(kneeIndex + 1 < production.count && !production[kneeIndex + 1].holds, "\(output)")
        await deployment.stop()
    }
}
