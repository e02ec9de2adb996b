import Testing

@testable import EncoreProcessor

@Suite("Simulated controller's shared delays")
struct SimulatedDelaysTests {
    @Test("every sleeper wakes, none before its deadline less the resolution, many at once")
    func sleepersWake() async throws {
        let clock = ContinuousClock()
        // How much earlier than asked each sleeper woke, beyond the resolution (none expected).
        let early = try await withThrowingTaskGroup(of: Duration?.self) { group in
            for index in 0..<2000 {
                group.addTask {
                    let wanted = Duration.milliseconds(index % 40)
                    let started = clock.now
                    try await SimulatedDelays.shared.sleep(for: wanted)
                    let slept = started.duration(to: clock.now)
                    return slept < wanted - SimulatedDelays.resolution ? wanted - slept : nil
                }
            }
            var early: [Duration] = []
            for try await wokeEarly in group { if let wokeEarly { early.append(wokeEarly) } }
            return early
        }
        #expect(early.isEmpty)
    }

    @Test("cancelling a sleeping task ends its sleep with CancellationError, also when cancelled before it sleeps")
    func cancellation() async throws {
        let clock = ContinuousClock()
        let started = clock.now
        let sleeping = Task { try await SimulatedDelays.shared.sleep(for: .seconds(600)) }
        try await Task.sleep(for: .milliseconds(20))
        sleeping.cancel()
        await #expect(throws: CancellationError.self) { try await sleeping.value }
        let cancelledFirst = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await SimulatedDelays.shared.sleep(for: .seconds(600))
        }
        await #expect(throws: CancellationError.self) { try await cancelledFirst.value }
        // Neither waited out its 600 s (a wide bound: only "not the whole sleep" is asserted).
        #expect(started.duration(to: clock.now) < .seconds(60))
    }
}
