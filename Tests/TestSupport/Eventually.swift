/// Polls `condition` until it holds or `timeout` passes: tests wait for conditions with a
/// deadline, never for a guessed time. Returns whether it held. The default deadline is far above
/// what any condition takes: beside `stress-ng`, the suite's tests queued on the two threads of the
/// cooperative pool for 46 s before their first step, and a 60 s wait of 200 outcomes that take a
/// second ran out.
public func eventually(
    timeout: Duration = .seconds(180), poll: Duration = .milliseconds(10), _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: timeout)
    while clock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: poll)
    }
    return try await condition()
}
