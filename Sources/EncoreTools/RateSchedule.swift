/// An offered rate over time: steady, or a linear ramp from one rate to another over a duration.
public struct RateSchedule: Sendable, Hashable {
    public var from: Double
    public var to: Double
    /// The ramp's length in seconds (a steady rate stays `from` however long it runs).
    public var over: Double

    public init(_ rate: Double) {
        self.init(from: rate, to: rate, over: 1)
    }

    public init(from: Double, to: Double, over: Double) {
        precondition(from >= 0 && to >= 0 && over > 0)
        self.from = from
        self.to = to
        self.over = over
    }

    /// Whether the rate changes over time.
    public var isRamp: Bool { from != to }

    /// Records per second `elapsed` seconds in.
    public func rate(at elapsed: Double) -> Double {
        from + (to - from) * min(max(elapsed, 0), over) / over
    }

    /// Records the schedule allows in the first `elapsed` seconds (the integral of the rate).
    public func allowed(at elapsed: Double) -> Int {
        let ramped = min(max(elapsed, 0), over)
        let during = from * ramped + (to - from) * ramped * ramped / (2 * over)
        return Int(during + to * max(0, elapsed - over))
    }
}
