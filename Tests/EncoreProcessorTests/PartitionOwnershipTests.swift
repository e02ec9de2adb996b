import Testing

@testable import EncoreProcessor

@Suite("Partition ownership: generations, revocation, hand-over")
struct PartitionOwnershipTests {
    let start = ContinuousClock.now
    static let p0 = InputPartition.requests(0)
    static let p1 = InputPartition.requests(1)

    func at(_ seconds: Double) -> ContinuousClock.Instant { start.advanced(by: .seconds(seconds)) }

    func handOvers(_ actions: [PartitionOwnership<String>.Action]) -> [String] {
        actions.compactMap { if case .handOver(let revocation) = $0 { revocation.handOver } else { nil } }
    }

    func overdue(_ actions: [PartitionOwnership<String>.Action]) -> [[InputPartition]] {
        actions.compactMap { if case .overdue(let partitions, _) = $0 { partitions } else { nil } }
    }

    @Test("a revoked partition is handed over only once nothing of it is in work, never at the deadline")
    func waitsForWork() throws {
        var ownership = PartitionOwnership<String>(reportInterval: .seconds(10))
        ownership.assign([Self.p0, Self.p1])
        let generation = try #require(ownership.generation(forNewRecordOf: Self.p0))
        let ref = RecordRef(partition: Self.p0, offset: 7, generation: generation)
        ownership.beginWork(ref)
        #expect(ownership.revoke([Self.p0], handOver: "ack", now: at(0), timeout: .seconds(5)) == [Self.p0])
        // No new records of a partition being revoked.
        #expect(ownership.generation(forNewRecordOf: Self.p0) == nil)
        #expect(ownership.generation(forNewRecordOf: Self.p1) != nil)
        #expect(ownership.poll(now: at(1), isHeld: { _ in false }).isEmpty)
        // Past the deadline: reported overdue (once per interval), still not handed over.
        let late = ownership.poll(now: at(5), isHeld: { _ in false })
        #expect(overdue(late) == [[Self.p0]] && handOvers(late).isEmpty)
        #expect(ownership.poll(now: at(6), isHeld: { _ in false }).isEmpty)
        #expect(overdue(ownership.poll(now: at(15), isHeld: { _ in false })) == [[Self.p0]])
        // Results still belong to the owned generation until the hand-over.
        #expect(ownership.owns(ref))
        ownership.endWork(ref)
        #expect(handOvers(ownership.poll(now: at(16), isHeld: { $0 == Self.p1 })) == ["ack"])
        #expect(!ownership.owns(ref))
        #expect(ownership.assigned == [Self.p1])
    }

    @Test("a partition assigned again gets a new generation: results of the old one are not owned")
    func reassignment() throws {
        var ownership = PartitionOwnership<String>()
        ownership.assign([Self.p0])
        let old = RecordRef(
            partition: Self.p0, offset: 0, generation: try #require(ownership.generation(forNewRecordOf: Self.p0)))
        _ = ownership.revoke([Self.p0], handOver: "ack", now: at(0), timeout: .seconds(5))
        #expect(handOvers(ownership.poll(now: at(0), isHeld: { _ in false })) == ["ack"])
        ownership.assign([Self.p0])
        let new = try #require(ownership.generation(forNewRecordOf: Self.p0))
        #expect(new != old.generation)
        #expect(!ownership.owns(old) && ownership.owns(RecordRef(partition: Self.p0, offset: 0, generation: new)))
        // Late work of the old generation does not count against the new one.
        ownership.endWork(old)
        ownership.beginWork(old)
        _ = ownership.revoke([Self.p0], handOver: "again", now: at(1), timeout: .seconds(5))
        #expect(handOvers(ownership.poll(now: at(1), isHeld: { _ in false })) == ["again"])
    }

    @Test("other unfinished business (a commit in flight, a changelog write) holds the hand-over")
    func held() {
        var ownership = PartitionOwnership<String>()
        ownership.assign([Self.p0])
        _ = ownership.revoke([Self.p0], handOver: "ack", now: at(0), timeout: .seconds(5))
        #expect(ownership.poll(now: at(0), isHeld: { _ in true }).isEmpty)
        #expect(handOvers(ownership.poll(now: at(0), isHeld: { _ in false })) == ["ack"])
    }

    @Test("draining takes no new records; the loop's end hands over what is still waiting")
    func drain() {
        var ownership = PartitionOwnership<String>()
        ownership.assign([Self.p0, Self.p1])
        ownership.beginDrain(now: at(0), timeout: .seconds(5))
        #expect(ownership.generation(forNewRecordOf: Self.p0) == nil)
        #expect(ownership.deadline(of: Self.p0) == at(5))
        _ = ownership.revoke([Self.p1], handOver: "ack", now: at(1), timeout: .seconds(5))
        #expect(ownership.deadline(of: Self.p1) == at(6))
        #expect(ownership.takeRevocations().map(\.handOver) == ["ack"])
        #expect(!ownership.hasRevocations)
    }
}
