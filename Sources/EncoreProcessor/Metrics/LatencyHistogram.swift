/// A log-linear histogram of non-negative values (microseconds here): 64 sub-buckets per power of
/// two, so any percentile is within about 1.6% of the true value, in constant memory.
public struct LatencyHistogram: Sendable, Hashable {
    private static let subBuckets = 64
    private var counts = [UInt64](repeating: 0, count: 128 + 57 * 64)
    public private(set) var count: UInt64 = 0
    public private(set) var max: UInt64 = 0
    public private(set) var sum: UInt64 = 0

    public init() {}

    private static func index(of value: UInt64) -> Int {
        if value < 128 { return Int(value) }
        let exponent = 63 - value.leadingZeroBitCount
        let shift = exponent - 6
        return 128 + (exponent - 7) * subBuckets + Int((value >> UInt64(shift)) - 64)
    }

    /// The largest value that falls in bucket `index`.
    private static func upperBound(of index: Int) -> UInt64 {
        if index < 128 { return UInt64(index) }
        let exponent = (index - 128) / subBuckets + 7
        let shift = UInt64(exponent - 6)
        let mantissa = UInt64((index - 128) % subBuckets + 64)
        return ((mantissa + 1) << shift) - 1
    }

    public mutating func record(_ value: UInt64) {
        counts[Self.index(of: value)] += 1
        count += 1
        sum &+= value
        if value > max { max = value }
    }

    public mutating func merge(_ other: LatencyHistogram) {
        for index in counts.indices { counts[index] += other.counts[index] }
        count += other.count
        sum &+= other.sum
        max = Swift.max(max, other.max)
    }

    /// The value at quantile `q` (0...1): the smallest bucket bound covering that share of values.
    public func percentile(_ q: Double) -> UInt64 {
        guard count > 0 else { return 0 }
        let rank = UInt64((Double(count) * q).rounded(.up))
        var seen: UInt64 = 0
        for (index, bucketCount) in counts.enumerated() where bucketCount > 0 {
            seen += bucketCount
            if seen >= Swift.max(rank, 1) { return Swift.min(Self.upperBound(of: index), max) }
        }
        return max
    }

    public var mean: Double { count == 0 ? 0 : Double(sum) / Double(count) }

    /// How many values are at most `bound` (counted by bucket: within about 1.6% of `bound`).
    public func count(atMost bound: UInt64) -> UInt64 {
        guard bound < max else { return count }
        let last = Self.index(of: bound)
        return counts.prefix(last + 1).reduce(0, +)
    }
}
