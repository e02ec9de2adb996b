import Testing

@testable import EncoreProcessor

/// `/healthz` and `/readyz` verdicts from what the processor knows (a blocked loop stops ticking).
@Suite("Processor health")
struct ProcessorHealthTests {
    static func vitals(running: Bool = true, joined: Bool = true, restoring: Int = 0, failure: String? = nil)
        -> ProcessorVitals.State
    {
        var state = ProcessorVitals.State()
        state.startedAtMs = 1_000
        state.running = running
        state.joined = joined
        state.restoring = restoring
        state.failure = failure
        return state
    }

    @Test("alive while the loops tick; a loop silent past the window is not alive, nor ready")
    func liveness() {
        let ticking = ProcessorHealth(vitals: Self.vitals(), lastTickAtMs: 10_000, nowMs: 10_020)
        #expect(ticking.isAlive && ticking.isReady && ticking.reasons.isEmpty)
        let stuck = ProcessorHealth(vitals: Self.vitals(), lastTickAtMs: 10_000, nowMs: 15_001)
        #expect(!stuck.isAlive && !stuck.isReady)
        #expect(stuck.reasons == ["a dispatch loop has not ticked for 5001 ms"])
        // Before the first tick, the start counts.
        #expect(ProcessorHealth(vitals: Self.vitals(), lastTickAtMs: 0, nowMs: 4_000).isAlive)
        #expect(!ProcessorHealth(vitals: Self.vitals(), lastTickAtMs: 0, nowMs: 7_000).isAlive)
    }

    @Test("ready only when joined and restored; never after a failure or a stop")
    func readiness() {
        let joining = ProcessorHealth(vitals: Self.vitals(joined: false), lastTickAtMs: 10_000, nowMs: 10_020)
        #expect(joining.isAlive && !joining.isReady)
        let restoring = ProcessorHealth(vitals: Self.vitals(restoring: 1), lastTickAtMs: 10_000, nowMs: 10_020)
        #expect(restoring.isAlive && !restoring.isReady)
        let failed = ProcessorHealth(vitals: Self.vitals(failure: "x"), lastTickAtMs: 10_000, nowMs: 10_020)
        #expect(!failed.isAlive && !failed.isReady)
        let stopped = ProcessorHealth(vitals: Self.vitals(running: false), lastTickAtMs: 10_000, nowMs: 10_020)
        #expect(!stopped.isAlive && stopped.reasons.contains("not running"))
    }
}
