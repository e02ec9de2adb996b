import Testing

@testable import EncoreProcessor

/// Exactly-once's protocol alone: when a commit is due, when it starts, what it releases.
@Suite("Transaction protocol: one transaction at a time (no Kafka)")
struct TransactionProtocolTests {
    typealias Transaction = TransactionProtocol<String, String>

    @Test(
        "a commit is due at the interval with something to commit, starts once every output is answered, and holds new outputs meanwhile"
    )
    func commitCycle() {
        var transaction = Transaction()
        // Nothing produced, no offset moved: nothing to commit, even when the interval passed.
        transaction.tick(isDue: true, offsetsChanged: false)
        #expect(transaction.phase == .open && transaction.startCommit() == nil)
        transaction.handed(3)
        transaction.tick(isDue: false, offsetsChanged: false)
        #expect(transaction.phase == .open, "not due yet")
        transaction.tick(isDue: true, offsetsChanged: false)
        #expect(transaction.phase == .draining && !transaction.acceptsOutputs)
        transaction.answered(2)
        #expect(transaction.startCommit() == nil, "an output of the transaction is unanswered")
        transaction.answered(1)
        #expect(transaction.startCommit() == [] && transaction.phase == .committing)
        #expect(transaction.startCommit() == nil, "one commit at a time")
        let ended = transaction.commitEnded()
        #expect(ended.items.isEmpty && ended.handOvers.isEmpty)
        #expect(transaction.phase == .open && transaction.acceptsOutputs && !transaction.produced)
    }

    @Test("an intent or a hand-over makes a commit due at once; the commit releases exactly what it held")
    func intentsAndHandOvers() {
        var transaction = Transaction()
        transaction.hold(intent: "req-0")
        transaction.handed(1)
        transaction.tick(isDue: false, offsetsChanged: false)
        #expect(transaction.phase == .draining)
        transaction.answered(1)
        #expect(transaction.startCommit() == [])
        // Held while the commit is in flight: they belong to the next transaction.
        transaction.hold(intent: "req-1")
        transaction.hold(handOver: "partition 3")
        let first = transaction.commitEnded()
        #expect(first.items == ["req-0"] && first.handOvers.isEmpty)
        // A hand-over alone is due, with nothing produced: its offsets must be committed.
        transaction.tick(isDue: false, offsetsChanged: false)
        #expect(transaction.startCommit() == ["partition 3"])
        let second = transaction.commitEnded()
        #expect(second.items == ["req-1"] && second.handOvers == ["partition 3"])
    }

    @Test("the end of a drain forces a commit; once closed nothing more is produced, even after a commit ends")
    func forcedAndClosed() {
        var transaction = Transaction()
        transaction.tick(isDue: false, offsetsChanged: false, force: true)
        #expect(transaction.startCommit() == [])
        transaction.close()
        _ = transaction.commitEnded()
        #expect(transaction.isClosed && !transaction.acceptsOutputs)
        transaction.tick(isDue: true, offsetsChanged: true, force: true)
        #expect(transaction.startCommit() == nil)
    }
}
