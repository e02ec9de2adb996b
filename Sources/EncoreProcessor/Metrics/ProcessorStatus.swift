import Foundation
import Kafka

/// What the status page shows (`GET /status` as JSON, `GET /` as HTML): one snapshot of the
/// processor, from the same sources as `/metrics`. It carries no configuration value and no
/// secret; its last errors are log lines, which never carry one either.
public struct ProcessorStatus: Sendable, Encodable {
    public struct Partition: Sendable, Encodable {
        public var topic: String
        public var partition: Int32
        /// Records behind the end (`nil` until librdkafka's statistics know it).
        public var lag: Int64?
        /// The next offset to read, the end a `read_committed` reader reads to, the high watermark.
        public var nextOffset: Int64
        public var lastStableOffset: Int64
        public var highWatermark: Int64
        /// How far the partition is read, 0 to 1 (of the high watermark).
        public var progress: Double
        public var fetchState: String
    }

    public struct InDoubt: Sendable, Encodable {
        public var open: Int
        public var oldestAgeSeconds: Double
        public var opened: Int
        public var resolved: Int
        public var expired: Int
    }

    public struct Count: Sendable, Encodable {
        public var name: String
        public var count: Int
    }

    public struct Rebalances: Sendable, Encodable {
        public var assigned: Int
        public var revoked: Int
        public var restores: Int
        public var restoreSeconds: Double
        public var restoring: Bool
    }

    public struct LogEntry: Sendable, Encodable {
        public var time: String
        public var level: String
        public var logger: String
        public var message: String
    }

    public var version: String
    public var librdkafka: String
    public var group: String
    public var instance: String
    public var guarantee: String
    public var uptimeSeconds: Double
    public var alive: Bool
    public var ready: Bool
    /// Why it is not alive or not ready.
    public var reasons: [String]
    public var partitions: [Partition]
    public var requestsReceived: Int
    /// Outcomes by result, most first.
    public var outcomes: [Count]
    public var callsInFlight: Int
    public var bufferedRecords: Int
    public var inDoubt: InDoubt
    /// Dead letters by reason (`stage/class`), most first.
    public var deadLetters: [Count]
    public var rebalances: Rebalances
    public var cpuSeconds: Double
    public var residentBytes: Int
    /// The last warnings and errors logged, newest first.
    public var lastErrors: [LogEntry]

    /// As JSON with snake_case keys, for `/status`.
    public var json: String {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        // (Every value is a string, a finite number, a bool or null: encoding cannot fail.)
        return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}
