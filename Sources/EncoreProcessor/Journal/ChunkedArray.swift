/// An array kept in chunks of a fixed number of elements: growing past the last chunk adds one.
///
/// A doubling array copies a large table into a buffer twice its size and frees the old one, so
/// a table of a million journal entries leaves tens of megabytes free behind it (resident until
/// the allocator returns them) and holds up to as many slots again as it uses. Here a table holds
/// at most one chunk it does not use, and nothing is copied as it grows. The first chunk grows as
/// an array does, so a small table stays small.
struct ChunkedArray<Element>: RandomAccessCollection, MutableCollection {
    /// Full chunks, then the last one being filled, then at most one emptied chunk kept for reuse
    /// (a table at a chunk's boundary neither allocates nor frees on every append and removal).
    private var chunks: [[Element]] = []
    /// Elements per chunk: by default as many as fit in 192 KiB with the array's header, one of
    /// the allocator's size classes, so no chunk is rounded up to a larger allocation.
    let chunkCapacity: Int
    private(set) var count = 0

    init(chunkCapacity: Int = ChunkedArray.defaultChunkCapacity) {
        precondition(chunkCapacity >= 1, "a chunk holds at least one element")
        self.chunkCapacity = chunkCapacity
    }

    static var defaultChunkCapacity: Int { Swift.max(1, (192 * 1024 - 32) / MemoryLayout<Element>.stride) }

    var startIndex: Int { 0 }
    var endIndex: Int { count }

    /// Slots allocated, used or not.
    var capacity: Int { chunks.reduce(0) { $0 + $1.capacity } }

    subscript(position: Int) -> Element {
        get {
            precondition(position >= 0 && position < count, "ChunkedArray index \(position) out of 0..<\(count)")
            return chunks[position / chunkCapacity][position % chunkCapacity]
        }
        set {
            precondition(position >= 0 && position < count, "ChunkedArray index \(position) out of 0..<\(count)")
            chunks[position / chunkCapacity][position % chunkCapacity] = newValue
        }
    }

    /// Chunks allocated, used or not.
    var chunkCount: Int { chunks.count }

    mutating func append(_ element: Element) {
        let chunk = count / chunkCapacity
        if chunk == chunks.count {
            var fresh: [Element] = []
            // (The first chunk grows as an array does; the next ones are one allocation each.)
            if chunk > 0 { fresh.reserveCapacity(chunkCapacity) }
            chunks.append(fresh)
        } else if chunk == 0, chunks[0].count == chunks[0].capacity {
            // Doubling, but never past a chunk: the first chunk ends at the same size as the others.
            chunks[0].reserveCapacity(Swift.min(chunkCapacity, Swift.max(16, chunks[0].capacity * 2)))
        }
        chunks[chunk].append(element)
        count += 1
    }

    mutating func removeLast() {
        precondition(count > 0, "removeLast on an empty ChunkedArray")
        chunks[(count - 1) / chunkCapacity].removeLast()
        count -= 1
        // One emptied chunk past those in use stays for reuse; a second one goes.
        if chunks.count > (count + chunkCapacity - 1) / chunkCapacity + 1 { chunks.removeLast() }
    }
}

extension ChunkedArray: Sendable where Element: Sendable {}
