import Kafka

/// A local state store compared with the changelog it caches (`encore-processor state-check`):
/// for each partition the store holds, whether a restore would trust it (the same rules as a
/// restore: docs/STATE.md, When the store is rebuilt) and, if it would, whether it holds exactly
/// the changelog's latest record of each key below its checkpoint. The one verdict that is a
/// defect is ``Verdict/trustedAndWrong``: a store a restore would use that differs from the truth.
public struct StateStoreCheck: Sendable {
    public enum Verdict: String, Sendable {
        /// Trusted, and key for key the changelog below the checkpoint.
        case consistent
        /// A restore would not trust it and would read the changelog from the beginning.
        case rebuilt
        /// Trusted by a restore, yet not the changelog below its checkpoint.
        case trustedAndWrong = "trusted-and-wrong"
    }

    public struct Partition: Sendable {
        public let partition: Int32
        /// The store's checkpoint: the changelog offset it holds the topic up to (exclusive).
        public let checkpoint: Int64
        /// Where a restore reads the changelog again from, below the checkpoint (an earlier restore
        /// read it only to a committed end there): the store is compared below it.
        public var rereadFrom: Int64? = nil
        /// The first offset and the end of what the changelog holds (the end as read, not as reported).
        public var changelogStart: Int64 = 0
        public var changelogEnd: Int64 = 0
        /// Why a restore would rebuild it (nil: it would be trusted).
        public var rebuildReason: String? = nil
        /// Keys whose latest record below the checkpoint the store holds, value for value.
        public var matching = 0
        /// Keys the changelog holds below the checkpoint and the store does not.
        public var missing = 0
        /// Keys the store holds that the changelog has nowhere.
        public var extra = 0
        /// Keys whose stored value is not the changelog's latest below the checkpoint.
        public var different = 0
        /// Keys the store holds whose records below the checkpoint are compacted away, leaving a
        /// later one past it: not comparable, and not wrong (the restore reads that later record).
        public var superseded = 0
        /// A few of the keys that differ, missing or extra (as text), for the report.
        public var examples: [String] = []

        public var verdict: Verdict {
            if rebuildReason != nil { return .rebuilt }
            return missing + extra + different == 0 ? .consistent : .trustedAndWrong
        }
    }

    public let directory: String
    /// What the store says it was built for, and why it would be rebuilt whole (nil: it would not).
    public let builtFor: String
    public let foreignReason: String?
    public var partitions: [Partition]

    /// No partition is trusted and wrong.
    public var isSafe: Bool { !partitions.contains { $0.verdict == .trustedAndWrong } }

    /// Reads the store in `directory` (the group's: `--state-dir`/group) and the changelog
    /// `stateTopic` through `kafka`, and compares them partition by partition. `guarantee` is the
    /// processor's: exactly-once, a restore rebuilds a checkpoint past the changelog's reported end.
    public static func run(
        directory: String, group: String, stateTopic: String, kafka: KafkaConfiguration,
        guarantee: DeliveryGuarantee, timeout: Duration
    ) async throws -> StateStoreCheck {
        let opened: (store: StateStore, format: Int?, group: String?, topic: String?)
        do { opened = try StateStore.openForReading(directory: directory) } catch {
            throw ProcessorError(.invalidConfiguration, "cannot open the state store in \(directory): \(error)")
        }
        let store = opened.store
        defer { store.close() }
        let builtFor =
            "format \(opened.format.map(String.init) ?? "?"), group '\(opened.group ?? "?")', changelog '\(opened.topic ?? "?")'"
        var foreignReason: String? = nil
        // (A store with no identity record at all is kept by the processor, which writes one.)
        let hasIdentity = opened.format != nil || opened.group != nil || opened.topic != nil
        if hasIdentity && (opened.format != StateStore.format || opened.group != group || opened.topic != stateTopic) {
            foreignReason =
                "built for \(builtFor), not format \(StateStore.format), group '\(group)', changelog '\(stateTopic)'"
        }
        // Where a restore would read each partition from (StoreRestorePlan, as the processor's
        // guarantee decides it).
        var checkpoints: [Int32: StateStore.Checkpoint] = [:]
        var starts: [Int32: StoreRestorePlan.Start] = [:]
        let admin = try KafkaAdmin(configuration: kafka)
        for partition in try store.storedPartitions() {
            let stored = try store.checkpoint(of: partition)
            checkpoints[partition] = stored ?? StateStore.Checkpoint(offset: 0, lastDigest: 0)
            let marks = try await admin.watermarks(
                of: KafkaTopicPartition(topic: stateTopic, partition: partition), timeout: timeout)
            starts[partition] = StoreRestorePlan.start(
                checkpoint: stored?.offset, readAgainFrom: try store.rereadOffset(of: partition), low: marks.low,
                high: marks.high, rebuildsPastEnd: guarantee == .exactlyOnce)
        }
        let rereads = starts.compactMapValues { start -> Int64? in
            guard case .readAgain(let from) = start else { return nil }
            return from
        }
        let read = try await readChangelog(
            of: checkpoints, rereads: rereads, topic: stateTopic, kafka: kafka, timeout: timeout)
        var partitions: [Partition] = []
        for (partition, checkpoint) in checkpoints.sorted(by: { $0.key < $1.key }) {
            var result = Partition(partition: partition, checkpoint: checkpoint.offset)
            result.rereadFrom = rereads[partition]
            let changelog = read[partition] ?? ChangelogRead()
            result.changelogStart = changelog.start ?? checkpoint.offset
            result.changelogEnd = changelog.end
            result.rebuildReason = foreignReason ?? rebuildReason(starts[partition]!, checkpoint, changelog)
            var seen = Set<[UInt8]>()
            try store.forEachRecord(of: partition) { key, value in
                seen.insert(key)
                if let below = changelog.below[key] {
                    if below == StateStore.digest(key: key, value: value) {
                        result.matching += 1
                    } else {
                        result.different += 1
                        result.note("different: \(text(key))")
                    }
                } else if changelog.past.contains(key) {
                    result.superseded += 1
                } else {
                    result.extra += 1
                    result.note("extra: \(text(key))")
                }
            }
            for key in changelog.below.keys where !seen.contains(key) {
                result.missing += 1
                result.note("missing: \(text(key))")
            }
            partitions.append(result)
        }
        return StateStoreCheck(
            directory: directory, builtFor: builtFor, foreignReason: foreignReason, partitions: partitions)
    }

    /// Why a restore would rebuild the partition, as it decides (StoreRestorePlan): from where it
    /// would start, then from the record before the checkpoint.
    private static func rebuildReason(
        _ start: StoreRestorePlan.Start, _ checkpoint: StateStore.Checkpoint, _ changelog: ChangelogRead
    ) -> String? {
        if case .rebuild(let reason) = start { return reason.map { "the store \($0)" } ?? "no checkpoint" }
        let verdict = StoreRestorePlan.verdict(
            checkpoint: checkpoint.offset, readAgain: start != .checkpoint,
            recordBefore: changelog.beforeCheckpoint.map { $0 == checkpoint.lastDigest }, heldBeforeStart: false,
            committedEnd: nil)
        guard verdict == .foreign else { return nil }
        guard changelog.beforeCheckpoint != nil else {
            return "the changelog has no record at offset \(checkpoint.offset - 1), just before the checkpoint"
        }
        return "the record at offset \(checkpoint.offset - 1) is not the one the checkpoint names"
    }

    /// One partition of the changelog: the digest of each key's latest record below the
    /// checkpoint (below where a restore reads again from, if that is lower), the keys with a
    /// record past it, and the record just before the checkpoint.
    private struct ChangelogRead: Sendable {
        var below: [[UInt8]: UInt64] = [:]
        var past: Set<[UInt8]> = []
        var beforeCheckpoint: UInt64? = nil
        var start: Int64? = nil
        var end: Int64 = 0

        mutating func add(_ key: [UInt8], digest: UInt64, offset: Int64, checkpoint: Int64, compareBelow: Int64) {
            if start == nil { start = offset }
            end = offset + 1
            if offset == checkpoint - 1 { beforeCheckpoint = digest }
            if offset < compareBelow {
                below[key] = digest
            } else {
                // Between where a restore reads again and the checkpoint, the store may hold this
                // record or an older one of its key: not compared.
                if offset < checkpoint { below[key] = nil }
                past.insert(key)
            }
        }
    }

    private static func readChangelog(
        of checkpoints: [Int32: StateStore.Checkpoint], rereads: [Int32: Int64], topic: String,
        kafka: KafkaConfiguration, timeout: Duration
    ) async throws -> [Int32: ChangelogRead] {
        guard !checkpoints.isEmpty else { return [:] }
        let read = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, partitions: checkpoints.keys.sorted(), timeout: timeout,
            into: [Int32: ChangelogRead]()
        ) { read, message in
            let checkpoint = checkpoints[message.partition]?.offset ?? 0
            let key = message.key ?? []
            let digest = StateStore.digest(key: message.key, value: message.value)
            // (In place: a copy of the partition's tables per record would be quadratic.)
            read[message.partition, default: ChangelogRead()].add(
                key, digest: digest, offset: message.offset, checkpoint: checkpoint,
                compareBelow: min(checkpoint, rereads[message.partition] ?? .max))
        }
        return read.state
    }

    private static func text(_ key: [UInt8]) -> String { String(decoding: key, as: UTF8.self) }
}

extension StateStoreCheck.Partition {
    fileprivate mutating func note(_ example: String) {
        if examples.count < 5 { examples.append(example) }
    }
}
