import Testing

@testable import Kafka

/// When a `read_committed` read settles for the committed ends: every partition still read held
/// short by an open transaction for the whole wait, the others read to their ends. On the mock
/// broker a reader is never held short, so the reader's tests on Tansu were the only ones before.
@Suite("Held ends: when a read settles for the committed ends")
struct HeldEndsTableTests {
    let start = ContinuousClock.now
    let wait = Duration.seconds(15)

    func at(_ seconds: Double) -> ContinuousClock.Instant { start.advanced(by: .seconds(seconds)) }

    /// Whether `table` settles at `seconds` with `count` partitions read (asked of a copy).
    func settles(_ table: HeldEndsTable, _ count: Int, at seconds: Double) -> Bool {
        var copy = table
        return copy.settle(remaining: count, after: wait, now: at(seconds))
    }

    /// `table` settled at `seconds`: what it reports then.
    func settled(
        _ table: HeldEndsTable, _ count: Int, at seconds: Double
    ) -> [Int32: (offset: Int64, end: Int64, start: Int64?)] {
        var copy = table
        _ = copy.settle(remaining: count, after: wait, now: at(seconds))
        return copy.shortEnds
    }

    @Test("settles once every partition not done has been held for the wait, and reports where each was held")
    func settlesAfterTheWait() {
        var table = HeldEndsTable()
        table.reached(0)
        table.heldShort(1, at: 40, end: 100, now: at(0))
        table.heldShort(2, at: 7, end: 9, now: at(5))
        #expect(!settles(table, 3, at: 19.9), "partition 2 held only 14.9 s")
        #expect(table.shortEnds.isEmpty, "nothing is reported before the read settles")
        #expect(settles(table, 3, at: 20))
        let ends = settled(table, 3, at: 20)
        #expect(ends.count == 2 && ends[1]! == (40, 100, nil) && ends[2]! == (7, 9, nil))
        var read = table
        _ = read.settle(remaining: 3, after: wait, now: at(20))
        #expect(read.unread == [1: 40..<100, 2: 7..<9], "what a read_committed reader could not see")
        // An end reported short of the committed end (Tansu: its last batch's first offset + 1).
        var short = HeldEndsTable()
        short.heldShort(0, at: 12, end: 10, now: at(0))
        _ = short.settle(remaining: 1, after: wait, now: at(15))
        #expect(short.unread == [0: 12..<12])
    }

    @Test("a partition neither held nor done keeps the read going, however long the others wait")
    func anUnheldPartitionKeepsItGoing() {
        var table = HeldEndsTable()
        table.heldShort(0, at: 40, end: 100, now: at(0))
        #expect(!settles(table, 2, at: 600))
        // A record arrives: the partition is not held any more, and its wait starts again.
        table.moved(0)
        table.heldShort(1, at: 3, end: 8, now: at(600))
        #expect(!settles(table, 2, at: 700))
        table.heldShort(0, at: 41, end: 100, now: at(700))
        #expect(!settles(table, 2, at: 714))
        #expect(settles(table, 2, at: 715))
        #expect(settled(table, 2, at: 715)[0]! == (41, 100, nil))
    }

    @Test("the same end of partition again keeps the wait's start; another offset starts it again")
    func theSameEndKeepsItsStart() {
        var table = HeldEndsTable()
        table.heldShort(0, at: 40, end: 100, now: at(0))
        table.heldShort(0, at: 40, end: 100, now: at(10))
        #expect(settles(table, 1, at: 15))
        var moved = HeldEndsTable()
        moved.heldShort(0, at: 40, end: 100, now: at(0))
        moved.heldShort(0, at: 45, end: 100, now: at(10))
        #expect(!settles(moved, 1, at: 15))
        #expect(settles(moved, 1, at: 25))
    }

    @Test(
        "a read fetched from past the committed end is held there with its start, until the committed end reaches it; never once done"
    )
    func pastTheStart() {
        var table = HeldEndsTable()
        table.heldPastStart(0, committedEnd: 3, start: 10, end: 12, now: at(0))
        // The statistics say so every 500 ms: the wait keeps its start.
        table.heldPastStart(0, committedEnd: 3, start: 10, end: 12, now: at(5))
        #expect(settles(table, 1, at: 15))
        #expect(settled(table, 1, at: 15)[0]! == (3, 12, 10))
        var read = table
        #expect(read.unread.isEmpty, "nothing is unread before the read settles")
        _ = read.settle(remaining: 1, after: wait, now: at(15))
        // From the committed end, not the start: what lies between is not committed either.
        #expect(read.unread == [0: 3..<12])

        var ended = HeldEndsTable()
        ended.heldPastStart(0, committedEnd: 3, start: 10, end: 12, now: at(0))
        // The transaction ended: the committed end is at or past the fetch position.
        ended.notPastStart(0)
        #expect(!settles(ended, 1, at: 15))
        // An end of partition short of the end is not cleared by it: only a past-the-start hold is.
        ended.heldShort(0, at: 11, end: 12, now: at(15))
        ended.notPastStart(0)
        #expect(settles(ended, 1, at: 30))

        var done = HeldEndsTable()
        done.reached(0)
        done.heldPastStart(0, committedEnd: 3, start: 10, end: 12, now: at(0))
        #expect(done.short.isEmpty, "a partition read to its end is not held again")
    }
}
