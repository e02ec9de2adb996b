import Foundation

/// What librdkafka's statistics (`statistics.interval.ms`) say of a consumer: per partition, where
/// it fetches and where the partition ends, and the group's state. Enough to name why a consumer
/// stalls: the last stable offset held below the high watermark (an open transaction, for a
/// `read_committed` reader), no assignment, or a fetch that is not active. (Of a producer, only its
/// producer id's state is read.)
public struct KafkaConsumerStatistics: Sendable, Equatable {
    /// One consumed partition.
    public struct Partition: Sendable, Equatable {
        /// Records behind the end (`consumer_lag`; `nil` while librdkafka does not know it).
        public var lag: Int64?
        /// The high watermark and the last stable offset (`hi_offset`, `ls_offset`): a
        /// `read_committed` reader reads up to the latter; below the former means a transaction
        /// is open there.
        public var highWatermark: Int64
        public var lastStableOffset: Int64
        /// The next offset to fetch (`next_offset`), and the fetcher's state (`fetch_state`:
        /// `active` when fetching; `none`, `stopping`, `offset-query`, `offset-wait`...).
        public var nextOffset: Int64
        public var fetchState: String
    }

    public var partitions: [KafkaTopicPartition: Partition] = [:]
    /// The group (`cgrp`): its state (`up` when working), join state (`steady` once assigned),
    /// and how many partitions it assigned this member.
    public var groupState: String?
    public var joinState: String?
    public var assignmentSize: Int?
    /// A producer's id state (`eos.idemp_state`), for an idempotent one: `Assigned` once it holds
    /// its producer id, `WaitPID` while a broker is asked for it, `WaitTransport` while no broker
    /// is up to ask (librdkafka tries again every 500 ms).
    var producerIDState: String?
    /// When librdkafka wrote these statistics (`ts`: its monotonic clock, `CLOCK_MONOTONIC`, in µs).
    var writtenAtMicroseconds: Int64?

    public init() {}

    /// Records behind the end per partition (known ones only).
    public var lag: [KafkaTopicPartition: Int64] { partitions.compactMapValues(\.lag) }

    /// Parses the `stats_cb` payload; partitions of no consumer interest (`fetch_state` `none` and
    /// no lag) are left out.
    static func parse(_ json: UnsafeRawBufferPointer) -> KafkaConsumerStatistics {
        var statistics = KafkaConsumerStatistics()
        guard let root = try? JSONSerialization.jsonObject(with: Data(json)) as? [String: Any] else {
            return statistics
        }
        statistics.producerIDState = (root["eos"] as? [String: Any])?["idemp_state"] as? String
        statistics.writtenAtMicroseconds = (root["ts"] as? NSNumber)?.int64Value
        if let group = root["cgrp"] as? [String: Any] {
            statistics.groupState = group["state"] as? String
            statistics.joinState = group["join_state"] as? String
            statistics.assignmentSize = (group["assignment_size"] as? NSNumber)?.intValue
        }
        guard let topics = root["topics"] as? [String: Any] else { return statistics }
        func number(_ fields: [String: Any], _ key: String) -> Int64 {
            (fields[key] as? NSNumber)?.int64Value ?? -1
        }
        for (topic, value) in topics {
            guard let partitions = (value as? [String: Any])?["partitions"] as? [String: Any] else { continue }
            for (key, value) in partitions {
                guard let partition = Int32(key), partition >= 0, let fields = value as? [String: Any] else { continue }
                let lag = number(fields, "consumer_lag")
                let fetchState = fields["fetch_state"] as? String ?? "none"
                guard lag >= 0 || fetchState != "none" else { continue }
                statistics.partitions[KafkaTopicPartition(topic: topic, partition: partition)] = Partition(
                    lag: lag >= 0 ? lag : nil, highWatermark: number(fields, "hi_offset"),
                    lastStableOffset: number(fields, "ls_offset"), nextOffset: number(fields, "next_offset"),
                    fetchState: fetchState)
            }
        }
        return statistics
    }
}
