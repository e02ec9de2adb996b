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

    @Test("a table holds at most one chunk past those in use, whatever was removed, and reuses it")
    func spareChunks() {
        var chunked = ChunkedArray<Int>(chunkCapacity: 5)
        for value in 0..<16 { chunked.append(value) }
        #expect(chunked.chunkCount == 4)
        chunked.removeLast()
        // Chunk 3, emptied, stays: appending again allocates no chunk.
        #expect(chunked.chunkCount == 4)
        chunked.append(15)
        #expect(chunked.chunkCount == 4)
        for _ in 0..<6 { chunked.removeLast() }
        // 10 elements fill chunks 0 and 1 exactly: one spare (chunk 2), chunk 3 freed.
        #expect(chunked.count == 10 && chunked.chunkCount == 3)
        for _ in 0..<10 { chunked.removeLast() }
        #expect(chunked.isEmpty && chunked.chunkCount == 1)
        for value in 0..<7 { chunked.append(value) }
        #expect(Array(chunked) == Array(0..<7) && chunked.chunkCount == 2)
    }

    @Test("chunks, the first included, are allocated at their size: no chunk grows past it by doubling")
    func chunkSizes() {
        var chunked = ChunkedArray<Int64>()
        let chunk = chunked.chunkCapacity
        #expect(chunk == (192 * 1024 - 32) / 8)
        for value in 0..<Int64(chunk * 3 + 1) { chunked.append(value) }
        #expect(chunked.chunkCount == 4)
        // (An allocator may round a chunk up to its page: at most 4 KiB more each.)
        #expect(chunked.capacity >= chunk * 4 && chunked.capacity <= (chunk + 512) * 4)
    }
}
