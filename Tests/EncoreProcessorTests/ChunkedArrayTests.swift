import Testing

@testable import EncoreProcessor

/// The journal table's storage against a plain array: the same elements in the same places
/// through appends, writes and removals across chunk boundaries, and at most one spare chunk.
@Suite("Chunked array: the journal table's storage (no Kafka)")
struct ChunkedArrayTests {
    @Test("random appends, writes and removals across chunks of 5 read back as a plain array does")
    func matchesArray() {
        var chunked = ChunkedArray<Int>(chunkCapacity: 5)
        var plain: [Int] = []
        var random = SplitMix64(seed: 5)
        for step in 0..<20_000 {
            switch random.next() % 10 {
            case 0..<5:
                chunked.append(step)
                plain.append(step)
            case 5..<7 where !plain.isEmpty:
                let position = Int(random.next() % UInt64(plain.count))
                chunked[position] = -step
                plain[position] = -step
            case 7..<10 where !plain.isEmpty:
                chunked.removeLast()
                plain.removeLast()
            default:
                break
            }
            if step % 997 == 0 { #expect(Array(chunked) == plain, "step \(step)") }
            #expect(chunked.count == plain.count)
        }
        #expect(Array(chunked) == plain)
    }

    @Test("a table holds at most one chunk beyond its last element, and chunks after the first are allocated whole")
    func spareChunks() {
        var chunked = ChunkedArray<Int64>()
        let chunk = chunked.chunkCapacity
        #expect(chunk == (192 * 1024 - 32) / 8)
        for value in 0..<Int64(chunk * 3 + 1) { chunked.append(value) }
        // Three whole chunks and one begun (allocated whole).
        #expect(chunked.capacity >= chunk * 4 && chunked.capacity < chunk * 4 + chunk / 2)
        chunked.removeLast()
        // The begun chunk, emptied, is kept: appending again allocates nothing.
        #expect(chunked.capacity >= chunk * 4)
        for _ in 0..<(chunk + 1) { chunked.removeLast() }
        // Two chunks in use (the second one element short), one spare; the fourth was freed.
        #expect(chunked.count == chunk * 2 - 1)
        #expect(chunked.capacity >= chunk * 3 && chunked.capacity < chunk * 3 + chunk / 2)
        #expect(chunked[chunk * 2 - 2] == Int64(chunk * 2 - 2))
    }
}
