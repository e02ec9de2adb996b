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

extension PurchaseProcessor {
    /// A snapshot for the status page.
    public func status(nowMs: Int64 = Int64(Date().timeIntervalSince1970 * 1000)) -> ProcessorStatus {
        let statistics = self.statistics
        let vitals = self.vitals.snapshot
        let health = self.health(nowMs: nowMs)
        let consumer = vitals.consumer?.statistics ?? KafkaConsumerStatistics()
        let resources = ProcessResources.current()
        func counted(_ counts: [String: Int]) -> [ProcessorStatus.Count] {
            counts.map { ProcessorStatus.Count(name: $0.key, count: $0.value) }
                .sorted { ($0.count, $1.name) > ($1.count, $0.name) }
        }
        var outcomes: [String: Int] = [:]
        for (key, count) in statistics.outcomesByController { outcomes[key.first, default: 0] += count }
        var deadLetters: [String: Int] = [:]
        for (key, count) in statistics.deadLettersByClass {
            deadLetters["\(key.first)/\(key.second)", default: 0] += count
        }
        return ProcessorStatus(
            version: EncoreVersion.current, librdkafka: LibrdkafkaVersion.string, group: configuration.groupID,
            instance: configuration.instanceID, guarantee: configuration.guarantee.rawValue,
            uptimeSeconds: vitals.startedAtMs.map { Double(max(0, nowMs - $0)) / 1000 } ?? 0,
            alive: health.isAlive, ready: health.isReady, reasons: health.reasons,
            partitions: consumer.partitions.map { key, value in
                ProcessorStatus.Partition(
                    topic: key.topic, partition: key.partition, lag: value.lag, nextOffset: value.nextOffset,
                    lastStableOffset: value.lastStableOffset, highWatermark: value.highWatermark,
                    progress: value.highWatermark > 0
                        ? min(1, Double(max(0, value.nextOffset)) / Double(value.highWatermark)) : 1,
                    fetchState: value.fetchState)
            }.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) },
            requestsReceived: statistics.received, outcomes: counted(outcomes), callsInFlight: statistics.inFlight,
            bufferedRecords: vitals.admission?.held ?? 0,
            inDoubt: .init(
                open: statistics.inDoubtOpen,
                oldestAgeSeconds: statistics.oldestInDoubtSinceMs.map { Double(max(0, nowMs - $0)) / 1000 } ?? 0,
                opened: statistics.inDoubtOpened, resolved: statistics.inDoubtResolved,
                expired: statistics.inDoubtExpired),
            deadLetters: counted(deadLetters),
            rebalances: .init(
                assigned: vitals.assignments, revoked: vitals.revocations, restores: vitals.restores,
                restoreSeconds: vitals.restoreSeconds, restoring: vitals.restoring > 0),
            cpuSeconds: resources.cpuSeconds, residentBytes: resources.residentBytes,
            lastErrors: Logger.recent.reversed().map {
                .init(time: $0.timestamp, level: "\($0.level)", logger: $0.logger, message: $0.message)
            })
    }
}
