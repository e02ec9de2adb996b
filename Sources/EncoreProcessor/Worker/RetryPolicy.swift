/// Exponential backoff with full jitter for retryable controller errors, bounded in attempts.
public struct RetryPolicy: Sendable, Hashable {
    /// Total controller calls for one request, the first included (1 = never retry).
    public var maxAttempts: Int
    public var initialBackoff: Duration
    public var maxBackoff: Duration

    public init(
        maxAttempts: Int = 5, initialBackoff: Duration = .milliseconds(100), maxBackoff: Duration = .seconds(10)
    ) {
        precondition(maxAttempts >= 1)
        self.maxAttempts = maxAttempts
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }

    /// Whether another call may follow attempt number `attempt` (1-based).
    public func allowsRetry(after attempt: Int) -> Bool { attempt < maxAttempts }

    /// The wait before the call that follows attempt `attempt`: uniform in [cap/2, cap], where cap
    /// doubles per attempt from `initialBackoff` up to `maxBackoff`. `unit` is a random value in [0, 1).
    public func backoff(after attempt: Int, unit: Double) -> Duration {
        let exponent = min(max(attempt - 1, 0), 30)
        let cap = min(initialBackoff * (1 << exponent), maxBackoff)
        return cap / 2 + (cap / 2) * unit
    }
}
