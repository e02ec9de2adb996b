/// A set that may answer "held" for what it does not hold, never "not held" for what it does:
/// `bits` bits (a power of two), four probes per element. A rebuild of the state store uses it to
/// skip reads of index entries it never wrote.
struct BloomFilter: Sendable {
    private var words: [UInt64]
    private let mask: UInt64

    init(bits: Int) {
        precondition(bits >= 64 && bits & (bits - 1) == 0, "a Bloom filter's bits are a power of two")
        words = [UInt64](repeating: 0, count: bits / 64)
        mask = UInt64(bits - 1)
    }

    mutating func insert(_ element: [UInt8]) {
        let (first, second) = Self.hashes(element)
        for probe in 0..<UInt64(4) {
            let bit = (first &+ probe &* second) & mask
            words[Int(bit >> 6)] |= 1 << (bit & 63)
        }
    }

    func mayHold(_ element: [UInt8]) -> Bool {
        let (first, second) = Self.hashes(element)
        for probe in 0..<UInt64(4) {
            let bit = (first &+ probe &* second) & mask
            if words[Int(bit >> 6)] & (1 << (bit & 63)) == 0 { return false }
        }
        return true
    }

    /// The two halves of a 64-bit hash: the probes are `first + i * second` (double hashing).
    private static func hashes(_ element: [UInt8]) -> (first: UInt64, second: UInt64) {
        let hash = StateStore.digest(key: element, value: [])
        return (hash & 0xffff_ffff, (hash >> 32) | 1)
    }
}
