import Testing

@testable import EncoreProcessor

@Suite("Store restore plan: where a restore reads, what its read tells, where the next reads again")
struct StoreRestorePlanTests {
    typealias Plan = StoreRestorePlan

    func start(
        _ checkpoint: Int64?, again: Int64? = nil, low: Int64 = 0, high: Int64 = 1_000, exactlyOnce: Bool = false
    ) -> Plan.Start {
        Plan.start(checkpoint: checkpoint, readAgainFrom: again, low: low, high: high, rebuildsPastEnd: exactlyOnce)
    }

    func isRebuild(_ start: Plan.Start) -> Bool {
        if case .rebuild = start { true } else { false }
    }

    @Test("no checkpoint, or one outside the changelog, is rebuilt; the reason says which")
    func rebuilds() {
        #expect(start(nil) == .rebuild(reason: nil))
        // The record before the checkpoint is gone (the topic deleted, truncated or compacted).
        guard case .rebuild(let reason?) = start(40, low: 40) else {
            Issue.record("a checkpoint whose record before it is below the changelog's start is trusted")
            return
        }
        #expect(reason.contains("outside the changelog's 40..<1000"), "\(reason)")
        #expect(start(41, low: 40) == .checkpoint)
        // Past the reported end: checked by reading at least once, rebuilt exactly-once.
        #expect(start(1_001) == .checkpoint)
        #expect(isRebuild(start(1_001, exactlyOnce: true)))
        #expect(start(1_000, exactlyOnce: true) == .checkpoint)
    }

    @Test("read again from the stored offset, or from the changelog's start if that is later")
    func readsAgain() {
        #expect(start(500, again: 300) == .readAgain(from: 300))
        #expect(start(500, again: 300, low: 350) == .readAgain(from: 350))
        // At or past the record before the checkpoint: the read from the checkpoint reads it anyway.
        #expect(start(500, again: 499) == .checkpoint)
        #expect(start(500, again: 498) == .readAgain(from: 498))
        #expect(start(500, again: 300, low: 499) == .checkpoint)
        // An offset past the checkpoint (this instance wrote past its end since) reads nothing again.
        #expect(start(500, again: 700) == .checkpoint)
    }

    @Test("more than the limit below the checkpoint is rebuilt; the limit counts from the changelog's start")
    func readAgainLimit() {
        let limit = Plan.readAgainLimit
        #expect(start(limit + 10, again: 10, high: 2 * limit) == .readAgain(from: 10))
        guard case .rebuild(let reason?) = start(limit + 10, again: 9, high: 2 * limit) else {
            Issue.record("more than the limit is read again")
            return
        }
        #expect(reason.contains("more than \(limit) records"), "\(reason)")
        // Records below the low watermark are gone: only what is left counts.
        #expect(start(limit + 10, again: 0, low: 10, high: 2 * limit) == .readAgain(from: 10))
    }

    @Test("the record before the checkpoint decides, unless a committed end keeps it out of reach")
    func verdicts() {
        func verdict(_ recordBefore: Bool?, again: Bool = false, heldBeforeStart: Bool = false, end: Int64? = nil)
            -> Plan.Verdict
        {
            Plan.verdict(
                checkpoint: 100, readAgain: again, recordBefore: recordBefore, heldBeforeStart: heldBeforeStart,
                committedEnd: end)
        }
        #expect(verdict(true) == .trusted)
        #expect(verdict(true, again: true, end: 150) == .trusted)
        #expect(verdict(false) == .foreign)
        // Never came, the read at the end: compacted away or aborted, not vouched for.
        #expect(verdict(nil) == .foreign)
        #expect(verdict(nil, again: true) == .foreign)
        // Settled at a committed end past the checkpoint, and still none: not vouched for either.
        #expect(verdict(nil, end: 100) == .foreign)
        // A committed end at or below the record before the checkpoint keeps it out of reach.
        #expect(verdict(nil, end: 99) == .trusted)
        #expect(verdict(nil, heldBeforeStart: true) == .trusted)
        #expect(verdict(nil, again: true, end: 60) == .heldBeforeCheckpoint)
        #expect(verdict(nil, again: true, heldBeforeStart: true) == .heldBeforeCheckpoint)
    }

    @Test("held before the checkpoint, only what was read again of keys with nothing held is applied")
    func settledRecords() {
        let readAgain: [(key: [UInt8]?, value: [UInt8])] = [
            (Array("a".utf8), [1]), (Array("b".utf8), [2]), (nil, [3]), (Array("a".utf8), [4]), (Array("c".utf8), [5]),
        ]
        let held: Set<StateStore.HashedBytes> = [StateStore.HashedBytes(Array("a".utf8)), StateStore.HashedBytes([])]
        let settled = Plan.settled(readAgain, heldKeys: held, key: \.key)
        // a has a record held past the committed end (maybe newer than the store's); so has the key-less.
        #expect(settled.map(\.value) == [[2], [5]])
        #expect(Plan.settled(readAgain, heldKeys: [], key: \.key).count == readAgain.count)
    }

    @Test("the next restore reads again from a committed end; held again, from the same offset; else nowhere")
    func nextReadAgain() {
        // Read to the end: nothing to read again.
        #expect(Plan.readAgainAfter(stored: nil, verdict: .trusted, committedEnd: nil) == .unchanged)
        #expect(Plan.readAgainAfter(stored: 300, verdict: .trusted, committedEnd: nil) == .remove)
        // Settled for a committed end: this instance's writes move the checkpoint past it.
        #expect(Plan.readAgainAfter(stored: nil, verdict: .trusted, committedEnd: 700) == .set(700))
        #expect(Plan.readAgainAfter(stored: 300, verdict: .trusted, committedEnd: 700) == .set(700))
        #expect(Plan.readAgainAfter(stored: 700, verdict: .trusted, committedEnd: 700) == .unchanged)
        // Held again before the checkpoint: only part applied, the same offset next time.
        #expect(Plan.readAgainAfter(stored: 300, verdict: .heldBeforeCheckpoint, committedEnd: 400) == .unchanged)
        // Rebuilt (the offset went with the store's partition): where the rebuild settled, if short.
        #expect(Plan.readAgainAfter(stored: nil, verdict: nil, committedEnd: 50) == .set(50))
        #expect(Plan.readAgainAfter(stored: nil, verdict: nil, committedEnd: nil) == .unchanged)
    }
}
