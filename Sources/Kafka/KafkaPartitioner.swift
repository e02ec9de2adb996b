/// The partition a key goes to under the Java client's default partitioner (librdkafka's
/// `murmur2` / `murmur2_random`): `(murmur2(key) & 0x7fffffff) % partitions`.
public enum KafkaPartitioner {
    /// Kafka's 32-bit murmur2 of `key` (seed 0x9747b28c).
    public static func murmur2(_ key: some Collection<UInt8>) -> UInt32 {
        let bytes = Array(key)
        let m: UInt32 = 0x5bd1_e995
        var h: UInt32 = 0x9747_b28c ^ UInt32(truncatingIfNeeded: bytes.count)
        let whole = bytes.count / 4 * 4
        var index = 0
        while index < whole {
            var k =
                UInt32(bytes[index]) | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2]) << 16
                | UInt32(bytes[index + 3]) << 24
            k = k &* m
            k ^= k >> 24
            k = k &* m
            h = h &* m
            h ^= k
            index += 4
        }
        let rest = bytes.count - whole
        if rest == 3 { h ^= UInt32(bytes[whole + 2]) << 16 }
        if rest >= 2 { h ^= UInt32(bytes[whole + 1]) << 8 }
        if rest >= 1 {
            h ^= UInt32(bytes[whole])
            h = h &* m
        }
        h ^= h >> 13
        h = h &* m
        h ^= h >> 15
        return h
    }

    /// The partition of `key` among `partitions` under the murmur2 partitioner.
    public static func murmur2Partition(key: some Collection<UInt8>, partitions: Int32) -> Int32 {
        Int32((murmur2(key) & 0x7fff_ffff) % UInt32(partitions))
    }
}
