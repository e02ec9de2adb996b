/// Polls `condition` until it holds or `timeout` passes: tests wait for conditions with a
/// deadline, never for a guessed time. Returns whether it held.
public func eventually(
    timeout: Duration = .seconds(60), poll: Duration = .milliseconds(10), _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: timeout)
    while clock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: poll)
    }
    return try await condition()
}
