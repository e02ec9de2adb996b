import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka

/// `encore-processor audit`: checks a range of requests and everything that belongs to them.
enum AuditCommand {
    static let definition = CommandDefinition(
        name: "audit",
        summary: "Check a time range of requests against the pipeline's promises (exit 1 on discrepancies).",
        usage: "audit --bootstrap-servers HOST:PORT [--from TIME] [--to TIME] [--json] [--html FILE] [options]",
        options: CommonOptions.kafka + CommonOptions.topics + [
            .option(
                "from", value: "TIME", "Requests whose record timestamp is at or after TIME (RFC 3339 or epoch ms)."),
            .option("to", value: "TIME", "Requests whose record timestamp is before TIME."),
            .flag("json", "Print one JSON object: the counts, figures and examples."),
            .option("html", value: "FILE", "Also write a self-contained HTML report to FILE."),
            .option(
                "compare", value: "PREFIX",
                "Instead: list the users whose grants or access answers differ between production's changelog and the replay PREFIX.*."
            ),
            .option("timeout-ms", value: "MS", default: "600000", "Give up reading a topic after this long."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            Reads the requests topic, then the outcomes, sources (when given), entitlement changes,
            changelog and dead-letter topics, each to its current end, and checks the requests whose
            record timestamp falls in the range: missing_outcomes, invalid_requests (a figure),
            undead_invalid, duplicate_outcomes, conflicting_outcomes, orphan_outcomes,
            order_violations, unexplained_changes, sequence_gaps, sequence_repeats, state_mismatches.
            Exit status: 0 without discrepancies, 1 with, 2 on a usage or connection error.
            With --compare PREFIX (after `replay --into PREFIX`): the users of the replay whose grants
            (product, entitlement, status, active) or access answers differ from production's;
            exit 1 when some do.
            """)

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        let kafka = try CommonOptions.clusterConfiguration(options)
        let range = PipelineAudit.TimeRange(
            fromMs: try options.string("from").map { try CommonOptions.time($0, option: "from") },
            toMs: try options.string("to").map { try CommonOptions.time($0, option: "to") })
        if let from = range.fromMs, let to = range.toMs, to <= from {
            throw UsageError("--to must be later than --from")
        }
        let timeout = try options.milliseconds("timeout-ms", minimum: 1)
        var topics: [PipelineAudit.Topic: String] = [
            .requests: options.string("requests-topic")!, .outcomes: options.string("outcomes-topic")!,
            .changes: options.string("entitlements-topic")!, .state: options.string("state-topic")!,
            .deadLetters: options.string("dead-letter-topic")!,
        ]
        topics[.sources] = options.string("sources-topic")
        if options.endsAtCheck() { return 0 }
        if let prefix = options.string("compare") {
            return try await compare(
                prefix: prefix, production: topics[.state]!, kafka: kafka, timeout: timeout, options: options)
        }
        let report: AuditReport
        do {
            guard let read = try await audit(range: range, topics: topics, kafka: kafka, timeout: timeout) else {
                return 2
            }
            report = read
        } catch {
            FileHandle.standardError.write(Data("audit: \(error)\n".utf8))
            return 2
        }
        if let path = options.string("html") {
            do {
                try Data(report.html().utf8).write(to: URL(fileURLWithPath: path))
            } catch {
                FileHandle.standardError.write(Data("audit: cannot write --html \(path): \(error)\n".utf8))
                return 2
            }
        }
        print(options.flag("json") ? report.json() : report.table())
        return report.failures == 0 ? 0 : 1
    }

    /// Reads every topic, in the order the audit needs them. `nil` when a topic does not exist.
    static func audit(
        range: PipelineAudit.TimeRange, topics: [PipelineAudit.Topic: String], kafka: KafkaConfiguration,
        timeout: Duration
    ) async throws -> AuditReport? {
        var audit = PipelineAudit(range: range, topics: topics)
        let progress = isatty(2) == 1
        for kind in PipelineAudit.Topic.allCases {
            guard let topic = topics[kind] else { continue }
            guard let partitions = try await CommonOptions.partitionCount(of: topic, described: "topic", kafka: kafka)
            else { return nil }
            var watermarks: [Int32: (low: Int64, high: Int64)] = [:]
            if kind == .requests || kind == .outcomes {
                let admin = try KafkaAdmin(configuration: kafka)
                for partition in 0..<Int32(partitions) {
                    watermarks[partition] = try await admin.watermarks(
                        of: KafkaTopicPartition(topic: topic, partition: partition))
                }
            }
            audit.startReading(kind, nowMs: wallClockMs(), watermarks: watermarks)
            let read = try await KafkaPartitionReader.fold(
                configuration: kafka, topic: topic, partitions: Array(0..<Int32(partitions)), timeout: timeout,
                into: (audit: consume audit, records: 0)
            ) { state, message in
                state.audit.read(message, of: kind)
                state.records += 1
                if progress && state.records % 65_536 == 0 {
                    FileHandle.standardError.write(Data("\rreading \(topic): \(state.records) records".utf8))
                }
            }
            audit = read.state.audit
            if progress {
                FileHandle.standardError.write(Data("\rread \(topic): \(read.records) records\u{1B}[K\n".utf8))
            }
        }
        return audit.finish()
    }

    /// `--compare PREFIX`: production's changelog against the replay's, user by user.
    static func compare(
        prefix: String, production: String, kafka: KafkaConfiguration, timeout: Duration, options: ParsedOptions
    ) async throws -> Int32 {
        let comparison: LedgerComparison
        do {
            let shadowTopic = ReplayCommand.Shadow(prefix: prefix).state
            guard let shadow = try await latestStates(of: shadowTopic, keeping: nil, kafka: kafka, timeout: timeout),
                let held = try await latestStates(
                    of: production, keeping: Set(shadow.keys), kafka: kafka, timeout: timeout)
            else { return 2 }
            let shadowRequests = ReplayCommand.Shadow(prefix: prefix).requests
            guard
                let partitions = try await CommonOptions.partitionCount(
                    of: shadowRequests, described: "replay's copy of the requests", kafka: kafka)
            else { return 2 }
            let replayed = try await KafkaPartitionReader.fold(
                configuration: kafka, topic: shadowRequests, partitions: Array(0..<Int32(partitions)),
                timeout: timeout, into: Set<String>()
            ) { ids, message in
                if let id = PurchaseRequestEvent.requestIDHint(message.value) { ids.insert(id) }
            }.state
            comparison = LedgerComparison(prefix: prefix, production: held, shadow: shadow, replayed: replayed)
        } catch {
            FileHandle.standardError.write(Data("audit: \(error)\n".utf8))
            return 2
        }
        if let path = options.string("html") {
            do {
                try Data(comparison.html().utf8).write(to: URL(fileURLWithPath: path))
            } catch {
                FileHandle.standardError.write(Data("audit: cannot write --html \(path): \(error)\n".utf8))
                return 2
            }
        }
        print(options.flag("json") ? comparison.json() : comparison.table())
        guard comparison.compared > 0 else {
            // Fail closed: nothing compared is not "no difference".
            FileHandle.standardError.write(Data("audit: the replay '\(prefix)' holds no user to compare\n".utf8))
            return 2
        }
        return comparison.differences.isEmpty ? 0 : 1
    }

    /// The latest changelog record of each user (of `keeping`, when given); `nil` when the topic does not exist.
    static func latestStates(
        of topic: String, keeping: Set<String>?, kafka: KafkaConfiguration, timeout: Duration
    ) async throws -> [String: EntitlementStateRecord]? {
        guard let partitions = try await CommonOptions.partitionCount(of: topic, described: "changelog", kafka: kafka)
        else { return nil }
        let latest = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, partitions: Array(0..<Int32(partitions)), timeout: timeout,
            into: [String: [UInt8]]()
        ) { latest, message in
            // (The request journal's records share the changelog: not a user's state.)
            guard !JournalRecord.isJournalKey(message.key),
                let key = message.key.map({ String(decoding: $0, as: UTF8.self) }),
                keeping?.contains(key) ?? true
            else { return }
            latest[key] = message.value.isEmpty ? nil : message.value
        }.state
        var states: [String: EntitlementStateRecord] = [:]
        for (key, value) in latest {
            // Fail closed: a record that cannot be read is not "no difference".
            states[key] = try EntitlementStateRecord(jsonBytes: value)
        }
        return states
    }
}
