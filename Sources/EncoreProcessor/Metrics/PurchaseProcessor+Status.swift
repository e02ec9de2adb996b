import Foundation
import Kafka

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
