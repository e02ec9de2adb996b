import Foundation
import Testing

/// The purchase-safety promise across crashes, from the outside: `scripts/chaos.py` runs the real
/// binary as a group of members on the embedded broker, SIGKILLs and restarts them, adds and
/// removes members while requests arrive, re-sends answered requests, and checks every request id
/// against a recording billing service (HTTP, honouring Idempotency-Key). The same script runs
/// against Tansu in CI (`scripts/ci-tansu.sh`).
@Suite("Chaos: SIGKILLs, restarts, scale-out and re-sends against a recording billing service")
struct ChaosTests {
    /// Runs the chaos script; returns its report, or records its output as the failure.
    func chaos(_ arguments: [String]) async throws -> [String: Any]? {
        let script = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"),
            [
                "python3", repositoryRoot.appendingPathComponent("scripts/chaos.py").path, "--binary",
                try processorBinary().path,
            ] + arguments)
        let status = await script.waitForExit(timeout: .seconds(420))
        let report = try? JSONSerialization.jsonObject(with: Data(script.stdout.utf8)) as? [String: Any]
        #expect(status == 0, "chaos \(arguments): \(script.stdout.suffix(3000))\n\(script.stderr.suffix(3000))")
        return report
    }

    @Test("the script's checks catch undeclared repeats, and excuse only a first call billing read late")
    func classification() async throws {
        let script = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"),
            ["python3", repositoryRoot.appendingPathComponent("scripts/chaos.py").path, "--self-test"])
        let status = await script.waitForExit(timeout: .seconds(60))
        #expect(status == 0, "\(script.stdout)\(script.stderr)")
    }

    @Test("at-least-once: no undeclared repeat, no overlap, none lost, no conflict, re-sends not called")
    func atLeastOnce() async throws {
        let report = try await chaos([])
        // The run did what it claims: members killed, recovery calls made, answered requests re-sent.
        #expect((report?["sigkills"] as? Int ?? 0) >= 4)
        #expect((report?["recovery_calls"] as? Int ?? 0) > 0)
        #expect((report?["resent"] as? Int ?? 0) > 0)
    }

    /// Two workers per member: each worker's transactions are its own (a producer each).
    @Test("exactly-once with SIGKILLs, two workers per member: the billing side holds as in at-least-once")
    func exactlyOnceKills() async throws {
        let report = try await chaos(["--guarantee", "exactly-once", "--workers", "2"])
        #expect((report?["sigkills"] as? Int ?? 0) >= 4)
        #expect((report?["recovery_calls"] as? Int ?? 0) > 0)
        #expect((report?["resent"] as? Int ?? 0) > 0)
    }

    @Test(
        "exactly-once without SIGKILLs, two workers per member: a read_committed reader sees one outcome per request and one change per sequence"
    )
    func exactlyOnceGraceful() async throws {
        let report = try await chaos(["--guarantee", "exactly-once", "--no-kill", "--workers", "2"])
        #expect(report?["exactly_once_checked"] as? Bool == true)
        #expect((report?["resent"] as? Int ?? 0) > 0)
    }
}
