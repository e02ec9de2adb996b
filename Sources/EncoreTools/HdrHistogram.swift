import CZlib
import Foundation

/// A High Dynamic Range histogram laid out as HdrHistogram's (Gil Tene's) own: the same buckets,
/// so its counts encode into HdrHistogram's compressed V2 format and any HdrHistogram library
/// (Java, Python's `hdrh`, Go, ...) reads what ``HdrHistogram/logLine(startSeconds:lengthSeconds:)`` writes.
///
/// Values are integers (microseconds in `loadtest`) from 1 to `highest`, kept to
/// `significantDigits` decimal digits of precision.
public struct HdrHistogram: Sendable, Hashable {
    public let highest: Int64
    public let significantDigits: Int
    private let subBucketHalfCountMagnitude: Int
    private let subBucketHalfCount: Int
    private let subBucketMask: Int64
    private let leadingZeroCountBase: Int
    private var counts: [Int64]
    public private(set) var totalCount: Int64 = 0
    public private(set) var maxValue: Int64 = 0

    /// - Parameters:
    ///   - highest: the largest value tracked; larger values are recorded as `highest`.
    ///   - significantDigits: 1 to 5.
    public init(highest: Int64 = 3_600_000_000, significantDigits: Int = 3) {
        precondition((1...5).contains(significantDigits) && highest >= 2)
        self.highest = highest
        self.significantDigits = significantDigits
        var largestSingleUnit: Int64 = 2
        for _ in 0..<significantDigits { largestSingleUnit *= 10 }
        // The sub-bucket count is the power of two that holds every value with single-unit resolution.
        let subBucketCountMagnitude = Int((log2(Double(largestSingleUnit))).rounded(.up))
        subBucketHalfCountMagnitude = subBucketCountMagnitude - 1
        let subBucketCount = 1 << subBucketCountMagnitude
        subBucketHalfCount = subBucketCount / 2
        subBucketMask = Int64(subBucketCount - 1)
        leadingZeroCountBase = 64 - subBucketCountMagnitude
        var smallestUntrackable = Int64(subBucketCount)
        var bucketCount = 1
        while smallestUntrackable <= highest {
            if smallestUntrackable > Int64.max / 2 {
                bucketCount += 1
                break
            }
            smallestUntrackable <<= 1
            bucketCount += 1
        }
        counts = [Int64](repeating: 0, count: (bucketCount + 1) * subBucketHalfCount)
    }

    private func index(of value: Int64) -> Int {
        let bucket = leadingZeroCountBase - (value | subBucketMask).leadingZeroBitCount
        let subBucket = Int(value >> Int64(bucket))
        return ((bucket + 1) << subBucketHalfCountMagnitude) + subBucket - subBucketHalfCount
    }

    /// The lowest value of the bucket at `index`, and the width of its range.
    private func range(at index: Int) -> (lowest: Int64, width: Int64) {
        var bucket = (index >> subBucketHalfCountMagnitude) - 1
        var subBucket = (index & (subBucketHalfCount - 1)) + subBucketHalfCount
        if bucket < 0 {
            subBucket -= subBucketHalfCount
            bucket = 0
        }
        return (Int64(subBucket) << Int64(bucket), Int64(1) << Int64(bucket))
    }

    /// Counts `value` (clamped to 0...``highest``).
    public mutating func record(_ value: Int64) {
        let value = min(max(value, 0), highest)
        counts[index(of: value)] += 1
        totalCount += 1
        maxValue = max(maxValue, value)
    }

    /// Adds the counts of `other`, a histogram of the same range and precision.
    public mutating func merge(_ other: HdrHistogram) {
        precondition(other.counts.count == counts.count, "histograms of different ranges")
        for index in counts.indices where other.counts[index] != 0 { counts[index] += other.counts[index] }
        totalCount += other.totalCount
        maxValue = max(maxValue, other.maxValue)
    }

    /// The value at `percentile` (0 to 100): the highest value equivalent to the bucket that
    /// holds that share of the values (as HdrHistogram reports it), at most the largest recorded.
    public func value(atPercentile percentile: Double) -> Int64 {
        guard totalCount > 0 else { return 0 }
        let wanted = max(1, Int64((min(percentile, 100) / 100 * Double(totalCount)).rounded(.up)))
        var seen: Int64 = 0
        for (index, count) in counts.enumerated() where count > 0 {
            seen += count
            if seen >= wanted {
                let (lowest, width) = range(at: index)
                return min(lowest + width - 1, maxValue)
            }
        }
        return maxValue
    }

    // MARK: HdrHistogram's encoding

    /// The histogram in HdrHistogram's V2 encoding (big-endian header, ZigZag LEB128 counts with
    /// runs of zeros), deflated (zlib) behind the compressed-encoding header.
    public func compressedEncoding() -> [UInt8] {
        var payload: [UInt8] = []
        let limit = totalCount == 0 ? 0 : index(of: maxValue) + 1
        var position = 0
        while position < limit {
            let count = counts[position]
            position += 1
            if count == 0 {
                var zeros: Int64 = 1
                while position < limit && counts[position] == 0 {
                    zeros += 1
                    position += 1
                }
                Self.putZigZag(zeros > 1 ? -zeros : 0, into: &payload)
            } else {
                Self.putZigZag(count, into: &payload)
            }
        }
        var encoded: [UInt8] = []
        Self.put(Int32(bitPattern: 0x1c84_9313), into: &encoded)  // V2 encoding, 8-byte words
        Self.put(Int32(payload.count), into: &encoded)
        Self.put(Int32(0), into: &encoded)  // normalizing index offset
        Self.put(Int32(significantDigits), into: &encoded)
        Self.put(Int64(1), into: &encoded)  // lowest discernible value
        Self.put(highest, into: &encoded)
        Self.put(Int64(bitPattern: Double(1).bitPattern), into: &encoded)  // integer-to-double ratio
        encoded += payload
        var deflated = [UInt8](repeating: 0, count: Int(compressBound(uLong(encoded.count))))
        var length = uLongf(deflated.count)
        let status = compress2(&deflated, &length, encoded, uLong(encoded.count), Z_DEFAULT_COMPRESSION)
        precondition(status == Z_OK, "zlib compress2 failed (\(status))")
        var compressed: [UInt8] = []
        Self.put(Int32(bitPattern: 0x1c84_9314), into: &compressed)  // V2 compressed encoding
        Self.put(Int32(length), into: &compressed)
        return compressed + deflated.prefix(Int(length))
    }

    /// One interval line of HdrHistogram's log format: start and length in seconds, the interval's
    /// maximum in milliseconds (values in microseconds), the compressed histogram in base64.
    public func logLine(startSeconds: Double, lengthSeconds: Double) -> String {
        String(format: "%.3f,%.3f,%.3f,", startSeconds, lengthSeconds, Double(maxValue) / 1000)
            + Data(compressedEncoding()).base64EncodedString()
    }

    /// A log holding `intervals` (start and length in seconds since `startedAt`), each histogram
    /// of microseconds; the format of HdrHistogram's `HistogramLogWriter`, version 1.3.
    public static func log(intervals: [(start: Double, length: Double, histogram: HdrHistogram)], startedAt: Date)
        -> String
    {
        var lines = [
            "#[Histogram log format version 1.3]",
            String(
                format: "#[StartTime: %.3f (seconds since epoch), %@]", startedAt.timeIntervalSince1970,
                ISO8601DateFormatter().string(from: startedAt)),
            String(format: "#[BaseTime: %.3f (seconds since epoch)]", startedAt.timeIntervalSince1970),
            "#[Values are request-to-outcome latencies in microseconds; Interval_Max in milliseconds]",
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"",
        ]
        for interval in intervals {
            lines.append(interval.histogram.logLine(startSeconds: interval.start, lengthSeconds: interval.length))
        }
        return lines.joined(separator: "\n") + "\n"
    }

    private static func putZigZag(_ value: Int64, into bytes: inout [UInt8]) {
        var zigzag = UInt64(bitPattern: (value << 1) ^ (value >> 63))
        // Eight groups of seven bits, then the ninth byte takes the last eight.
        for _ in 0..<8 {
            if zigzag >> 7 == 0 {
                bytes.append(UInt8(zigzag))
                return
            }
            bytes.append(UInt8(zigzag & 0x7F) | 0x80)
            zigzag >>= 7
        }
        bytes.append(UInt8(truncatingIfNeeded: zigzag))
    }

    private static func put<I: FixedWidthInteger>(_ value: I, into bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }
}
