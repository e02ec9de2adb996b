/// The partitions whose readable end (`read_committed`: the last stable offset) stays short of
/// the end the reader aims at, and since when: a state machine with no I/O, the clock given.
struct HeldEndsTable {
    struct Short {
        var offset: Int64
        var end: Int64
        var since: ContinuousClock.Instant
        /// Where the read began, past `offset` (``heldPastStart(_:committedEnd:start:end:now:)``).
        var start: Int64? = nil
    }

    private(set) var short: [Int32: Short] = [:]
    /// Partitions read to their end.
    private(set) var done: Set<Int32> = []
    private(set) var settled = false

    /// The consumer reached `offset`, short of `end`: held from `now` unless it already was there.
    mutating func heldShort(_ partition: Int32, at offset: Int64, end: Int64, now: ContinuousClock.Instant) {
        if short[partition]?.offset != offset {
            short[partition] = Short(offset: offset, end: end, since: now)
        }
    }

    /// The consumer fetches the partition from `start`, past its committed end (`read_committed`:
    /// the last stable offset): held from `now` unless it already was there, or done.
    mutating func heldPastStart(
        _ partition: Int32, committedEnd: Int64, start: Int64, end: Int64, now: ContinuousClock.Instant
    ) {
        guard !done.contains(partition), short[partition]?.offset != committedEnd else { return }
        short[partition] = Short(offset: committedEnd, end: end, since: now, start: start)
    }

    /// The partition's committed end is at or past the fetch position (the transaction ended).
    mutating func notPastStart(_ partition: Int32) {
        if short[partition]?.start != nil { short[partition] = nil }
    }

    /// A record of the partition arrived: it is not held.
    mutating func moved(_ partition: Int32) { short[partition] = nil }

    mutating func reached(_ partition: Int32) {
        short[partition] = nil
        done.insert(partition)
    }

    /// Whether every one of the `count` partitions read is done or held, each held for `wait` at
    /// least by `now`; once true, the read is settled.
    mutating func settle(remaining count: Int, after wait: Duration, now: ContinuousClock.Instant) -> Bool {
        guard done.count + short.count == count, short.values.allSatisfy({ now - $0.since >= wait }) else {
            return false
        }
        settled = true
        return true
    }

    /// The partitions read to a committed end short of their end (after ``settle(remaining:after:now:)``).
    var shortEnds: [Int32: (offset: Int64, end: Int64, start: Int64?)] {
        settled ? short.mapValues { ($0.offset, $0.end, $0.start) } : [:]
    }

    /// What a `read_committed` reader could not see of them (after ``settle(remaining:after:now:)``):
    /// from the committed end, also where the read began past it (what lies between is not
    /// committed for such a reader either), to the end aimed at.
    var unread: [Int32: Range<Int64>] {
        settled ? short.mapValues { $0.offset..<max($0.offset, $0.end) } : [:]
    }
}
