import Foundation

/// Offsets finished beyond a partition's committed offset, carried in the commit's metadata.
///
/// Requests of different users finish out of order, so the committed offset (the first unfinished
/// record) can lag far behind what is done. The next owner of the partition (after a rebalance or a
/// restart) reads this set back and skips those records instead of calling the controller again.
/// Encoded as `encore1:` and a base64 bitmap: bit `i` stands for offset `committed + 1 + i`.
enum FinishedOffsets {
    static let prefix = "encore1:"
    /// Bitmap bytes at most (Kafka's default `offset.metadata.max.bytes` is 4096); offsets beyond
    /// it are simply redone.
    static let maximumBitmapBytes = 2048

    /// The metadata for `finished` offsets above `committed`, or `nil` when there are none.
    static func encode(committed: Int64, finished: some Sequence<Int64>) -> String? {
        var bitmap = [UInt8]()
        for offset in finished where offset > committed {
            let bit = offset - committed - 1
            let byte = Int(bit / 8)
            guard byte < maximumBitmapBytes else { continue }
            if byte >= bitmap.count { bitmap += [UInt8](repeating: 0, count: byte - bitmap.count + 1) }
            bitmap[byte] |= 1 << UInt8(bit % 8)
        }
        guard !bitmap.isEmpty else { return nil }
        return prefix + Data(bitmap).base64EncodedString()
    }

    /// The finished offsets recorded in `metadata` for a partition committed at `committed`;
    /// empty for metadata written by anything else.
    static func decode(_ metadata: String?, committed: Int64) -> Set<Int64> {
        guard let metadata, metadata.hasPrefix(prefix), committed >= 0,
            let bitmap = Data(base64Encoded: String(metadata.dropFirst(prefix.count)))
        else { return [] }
        var offsets = Set<Int64>()
        for (index, byte) in bitmap.enumerated() where byte != 0 {
            for bit in 0..<8 where byte & (1 << bit) != 0 {
                offsets.insert(committed + 1 + Int64(index * 8 + bit))
            }
        }
        return offsets
    }
}
