/// At most `perSecond` warnings of a kind a second: a flood of dead letters does not flood the log.
struct WarningRateLimit {
    let perSecond: Int
    private var windowStart: ContinuousClock.Instant? = nil
    private var used = 0
    private var leftOut = 0

    init(perSecond: Int) {
        self.perSecond = perSecond
    }

    /// Whether a warning may be written now, and how many were left out in the window that ended
    /// (to be said once).
    mutating func allow(now: ContinuousClock.Instant) -> (allowed: Bool, leftOut: Int) {
        var ended = 0
        if windowStart.map({ now - $0 >= .seconds(1) }) ?? true {
            ended = leftOut
            (windowStart, used, leftOut) = (now, 0, 0)
        }
        guard used < perSecond else {
            leftOut += 1
            return (false, ended)
        }
        used += 1
        return (true, ended)
    }

    /// How many were left out in a window that has ended by `now` (said once; 0 otherwise): on
    /// the clock, so that a flood's count is told even when no later warning comes to carry it.
    mutating func endedWindowLeftOut(now: ContinuousClock.Instant) -> Int {
        guard leftOut > 0, let windowStart, now - windowStart >= .seconds(1) else { return 0 }
        defer { leftOut = 0 }
        return leftOut
    }
}
