import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import Synchronization

/// `encore-processor replay`: reprocesses a range of requests into shadow topics, answering from
/// production's recorded outcomes (or a chosen controller), never touching production.
enum ReplayCommand {
    static let definition = CommandDefinition(
        name: "replay",
        summary: "Reprocess a range of requests into shadow topics PREFIX.* (recorded answers: no billing call).",
        usage:
            "replay --bootstrap-servers HOST:PORT (--from TIME | --from-offsets P:O,...) [--to TIME] --into PREFIX [--controller recorded|simulated|http] [--catalog FILE] [options]",
        options: CommonOptions.kafka + CommonOptions.topics
            + RunCommand.controllerOptions.map { option in
                // Never the production controller by accident: no environment variable, recorded by default.
                option.name == "controller"
                    ? .option(
                        "controller", value: "KIND", default: "recorded", environment: "",
                        "recorded (production's answers, no billing call), simulated or http.")
                    : option
            } + RunCommand.ledgerOptions + [
                .option("into", value: "PREFIX", "Shadow topics PREFIX.purchase-requests, .purchase-outcomes, ..."),
                .option("from", value: "TIME", "Replay requests whose record timestamp is at or after TIME."),
                .option(
                    "from-offsets", value: "P:O,...",
                    "Replay from these offsets of the requests topic (partitions not named are not replayed)."),
                .option("to", value: "TIME", "Stop before the first request at or after TIME (default: the end now)."),
                .option(
                    "replication-factor", value: "N", default: "-1",
                    "Replicas of the shadow topics' partitions (-1: the broker's default)."),
                .option("timeout-ms", value: "MS", default: "600000", "Give up when the replay is not over by then."),
                .flag("json", "Print the summary as one JSON object."),
                .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
            ],
        discussion: """
            Copies the range of the requests topic into PREFIX.purchase-requests, then processes it
            with its own group (PREFIX.replay) into PREFIX.purchase-outcomes,
            PREFIX.entitlement-changes, PREFIX.dead-letters and PREFIX.entitlement-state, and stops
            at the end of the range with a summary. It never writes a production topic nor touches
            the production group; a PREFIX that names a production topic, or whose topics already
            hold a replay, is refused. Deadlines are not enforced: the replay answers as production
            did. The sources topic is not replayed. Compare with: audit --compare PREFIX.
            """)

    struct Shadow {
        let prefix: String
        var requests: String { "\(prefix).purchase-requests" }
        var outcomes: String { "\(prefix).purchase-outcomes" }
        var changes: String { "\(prefix).entitlement-changes" }
        var deadLetters: String { "\(prefix).dead-letters" }
        var state: String { "\(prefix).entitlement-state" }
        var group: String { "\(prefix).replay" }
        var all: [String] { [requests, outcomes, changes, deadLetters, state] }
    }

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        let kafka = try CommonOptions.clusterConfiguration(options)
        guard let prefix = options.string("into"), !prefix.isEmpty else {
            throw UsageError("--into PREFIX is required")
        }
        guard prefix.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) }) else {
            throw UsageError("--into: '\(prefix)' may hold only letters, digits, '.', '_' and '-'")
        }
        let shadow = Shadow(prefix: prefix)
        let production = CommonOptions.topicNames(options)
        if let clash = shadow.all.first(where: production.contains) {
            throw UsageError("--into: '\(prefix)' would write the production topic '\(clash)'")
        }
        let start = try startOffsets(options)
        let to = try options.string("to").map { try CommonOptions.time($0, option: "to") }
        if case .time(let from) = start, let to, to <= from { throw UsageError("--to must be later than --from") }
        let controller = try options.choice("controller", ["recorded", "simulated", "http"])
        let recordedRouter = controller == "recorded" ? PurchaseRouter() : nil
        let (configuration, router) = try RunCommand.processorSetup(options, kafka: kafka, router: recordedRouter)
        let timeout = try options.milliseconds("timeout-ms", minimum: 1)
        let replication = try options.integer("replication-factor", range: -1...100)
        guard replication != 0 else { throw UsageError("--replication-factor: 0 replicas cannot hold a record") }
        if options.endsAtCheck() { return 0 }
        do {
            return try await replay(
                production: production, shadow: shadow, start: start, to: to, replication: replication,
                recorded: recordedRouter != nil, configuration: configuration, router: router, timeout: timeout,
                json: options.flag("json"))
        } catch let error as UsageError {
            throw error
        } catch {
            FileHandle.standardError.write(Data("replay: \(error)\n".utf8))
            return 2
        }
    }

    /// Copies the range, then processes it into the shadow topics; the exit status.
    static func replay(
        production: [String], shadow: Shadow, start: Start, to: Int64?, replication: Int, recorded isRecorded: Bool,
        configuration: ProcessorConfiguration, router: PurchaseRouter, timeout: Duration, json: Bool
    ) async throws -> Int32 {
        var (configuration, router) = (configuration, router)
        // Never production's transactional id nor static membership: either would fence or
        // displace a production member.
        configuration.kafka["transactional.id"] = nil
        configuration.kafka["group.instance.id"] = nil
        let kafka = configuration.kafka
        let requestsTopic = production[0]
        guard
            let partitions = try await CommonOptions.partitionCount(
                of: requestsTopic, described: "requests topic", kafka: kafka)
        else { return 2 }
        if let used = try await firstNonEmpty(shadow.all, kafka: kafka) {
            FileHandle.standardError.write(
                Data("replay: '\(used)' already holds records (an earlier replay?): choose another --into\n".utf8))
            return 2
        }
        let plan = try await plan(
            of: requestsTopic, partitions: partitions, start: start, to: to, kafka: kafka)
        try await KafkaAdmin.create(
            shadow.all.map { name in
                KafkaTopicSpecification(
                    name: name, partitions: partitions, replicationFactor: replication,
                    configs: name == shadow.state ? ["cleanup.policy": "compact"] : [:])
            }, kafka: kafka, logger: Logger(label: "encore.replay"))
        for topic in shadow.all {
            let count = try await CommonOptions.partitionCount(of: topic, described: "shadow topic", kafka: kafka)
            guard count == partitions else {
                FileHandle.standardError.write(
                    Data(
                        "replay: '\(topic)' has \(count ?? 0) partitions, '\(requestsTopic)' has \(partitions): create the shadow topics first (topics create with the PREFIX.* names)\n"
                            .utf8))
                return 2
            }
        }
        if try await hasCommittedOffsets(
            group: shadow.group, topic: shadow.requests, partitions: partitions, kafka: kafka)
        {
            // Offsets of an earlier replay would make this one look over before it began.
            FileHandle.standardError.write(
                Data("replay: the group '\(shadow.group)' already has offsets: choose another --into\n".utf8))
            return 2
        }
        let copied = try await copy(plan, from: requestsTopic, to: shadow.requests, kafka: kafka, timeout: timeout)
        let log = FileHandle.standardError
        log.write(
            Data("replay: copied \(copied.records) requests of '\(requestsTopic)' into '\(shadow.requests)'\n".utf8))

        var recorded: RecordedController? = nil
        if isRecorded {
            let recordings = try await recordings(
                of: copied.requestIDs, in: production[1], kafka: kafka, timeout: timeout)
            let controller = RecordedController(recordings: recordings)
            router.register("recorded", controller)
            router.route(.any, to: "recorded")
            recorded = controller
        }
        configuration.requestsTopic = shadow.requests
        configuration.outcomesTopic = shadow.outcomes
        configuration.entitlementsTopic = shadow.changes
        configuration.deadLetterTopic = shadow.deadLetters
        configuration.stateTopic = shadow.state
        configuration.sourcesTopic = nil
        configuration.groupID = shadow.group
        configuration.enforcesDeadlines = false
        let processor = try PurchaseProcessor(configuration: configuration, router: router)
        let signals = SignalHandler { _ in processor.shutdown() }
        defer { signals.cancel() }
        let finished = try await process(
            processor, until: copied.ends, topic: shadow.requests, group: shadow.group, kafka: kafka,
            timeout: timeout)
        let statistics = processor.statistics
        let summary = Summary(
            prefix: shadow.prefix, requests: copied.records, finished: finished, statistics: statistics,
            recorded: recorded?.calls)
        print(json ? summary.json() : summary.text())
        return finished ? 0 : 2
    }

    enum Start {
        case time(Int64)
        case offsets([Int32: Int64])
    }

    static func startOffsets(_ options: ParsedOptions) throws(UsageError) -> Start {
        switch (options.string("from"), options.string("from-offsets")) {
        case (let time?, nil):
            return .time(try CommonOptions.time(time, option: "from"))
        case (nil, let list?):
            var offsets: [Int32: Int64] = [:]
            for item in list.split(separator: ",") {
                let parts = item.split(separator: ":")
                guard parts.count == 2, let partition = Int32(parts[0]), partition >= 0, let offset = Int64(parts[1]),
                    offset >= 0, offsets[partition] == nil
                else {
                    throw UsageError("--from-offsets: '\(item)' is not PARTITION:OFFSET (each partition once)")
                }
                offsets[partition] = offset
            }
            guard !offsets.isEmpty else { throw UsageError("--from-offsets: no PARTITION:OFFSET given") }
            return .offsets(offsets)
        default:
            throw UsageError("give exactly one of --from TIME and --from-offsets P:O,...")
        }
    }

    /// The first of `topics` that exists and holds records.
    static func firstNonEmpty(_ topics: [String], kafka: KafkaConfiguration) async throws -> String? {
        var configuration = kafka
        configuration["allow.auto.create.topics"] = "false"
        let admin = try KafkaAdmin(configuration: configuration)
        for topic in topics {
            guard let count = try await admin.partitionCount(of: topic) else { continue }
            for partition in 0..<Int32(count) {
                let marks = try await admin.watermarks(of: KafkaTopicPartition(topic: topic, partition: partition))
                if marks.high > 0 { return topic }
            }
        }
        return nil
    }

    /// Whether `group` has a committed offset for a partition of `topic`.
    static func hasCommittedOffsets(
        group: String, topic: String, partitions: Int, kafka: KafkaConfiguration
    ) async throws -> Bool {
        var configuration = kafka
        configuration["group.id"] = group
        let consumer = try KafkaConsumer(configuration: configuration)
        do {
            let committed = try await consumer.committed(
                (0..<Int32(partitions)).map { KafkaTopicPartition(topic: topic, partition: $0) })
            await consumer.close()
            return committed.contains { $0.offset >= 0 }
        } catch {
            await consumer.close()
            throw error
        }
    }

    /// What to copy of each partition. The watermarks cannot be trusted for the end: some brokers
    /// (Tansu) report a partition's end as its last record batch's first offset + 1, short of the
    /// batch's other records. So only an end found by a record's time (`--to`) is exact; otherwise
    /// a partition is read to its end-of-partition, past the watermark.
    struct Plan: Equatable {
        /// Partitions whose range ends at a record's offset (the first at or after `--to`).
        var exact: [Int32: Range<Int64>] = [:]
        /// Partitions read from their first offset to their end-of-partition (at least to the
        /// offset given), or, past that offset, to the first record written at or after `cutoff`
        /// (ms: `--to`, else the time the replay began), so records written during the copy are
        /// not copied, however fast they come.
        var starts: [Int32: Int64] = [:]
        var ends: [Int32: Int64] = [:]
        var cutoff: Int64 = 0

        var isEmpty: Bool { exact.isEmpty && starts.isEmpty }

        /// `marks`: each partition's watermarks. `starts`: the first offset to copy, and whether a
        /// record is known to be there (found by time). `stops`: with `--to`, the first record at
        /// or after it (`nil`: none).
        static func make(
            marks: [Int32: (low: Int64, high: Int64)], starts: [Int32: (offset: Int64, isRecord: Bool)],
            stops: [Int32: Int64?]?, cutoff: Int64
        ) -> Plan {
            var plan = Plan(cutoff: cutoff)
            for (partition, start) in starts {
                guard let mark = marks[partition] else { continue }
                let first = max(start.offset, mark.low)
                if let stop = stops?[partition] ?? nil {
                    if first < stop { plan.exact[partition] = first..<stop }
                    continue
                }
                // Read to the end-of-partition; at least to the watermark, and past `first` when a
                // record is known there (a short watermark may put the end before it).
                let end = start.isRecord ? max(mark.high, first + 1) : mark.high
                if first < end {
                    plan.starts[partition] = first
                    plan.ends[partition] = end
                }
            }
            return plan
        }
    }

    /// What to replay of each partition, from the start to `to` (or the end).
    static func plan(
        of topic: String, partitions: Int, start: Start, to: Int64?, kafka: KafkaConfiguration
    ) async throws -> Plan {
        let began = Int64(Date().timeIntervalSince1970 * 1000)
        let admin = try KafkaAdmin(configuration: kafka)
        let all = (0..<Int32(partitions)).map { KafkaTopicPartition(topic: topic, partition: $0) }
        var marks: [Int32: (low: Int64, high: Int64)] = [:]
        for partition in all { marks[partition.partition] = try await admin.watermarks(of: partition) }
        // The first record at or after `ms` in each partition (`nil`: none).
        func records(at ms: Int64) async throws -> [Int32: Int64?] {
            var found: [Int32: Int64?] = [:]
            for entry in try await admin.offsets(atOrAfter: ms, of: all) {
                found[entry.partition] = entry.offset >= 0 ? entry.offset : nil
            }
            return found
        }
        let starts: [Int32: (offset: Int64, isRecord: Bool)]
        switch start {
        case .time(let ms):
            starts = try await records(at: ms).compactMapValues { found in found.map { ($0, true) } }
        case .offsets(let given):
            if let unknown = given.keys.first(where: { marks[$0] == nil }) {
                throw UsageError("--from-offsets: '\(topic)' has no partition \(unknown)")
            }
            starts = given.mapValues { ($0, false) }
        }
        var stops: [Int32: Int64?]? = nil
        if let to { stops = try await records(at: to) }
        let plan = Plan.make(marks: marks, starts: starts, stops: stops, cutoff: to ?? began)
        if case .offsets(let given) = start {
            for (partition, offset) in given.sorted(by: { $0.key < $1.key })
            where plan.starts[partition] == nil && plan.exact[partition] == nil {
                FileHandle.standardError.write(
                    Data(
                        "replay: partition \(partition) from offset \(offset): at or past its end as the broker reports it (\(marks[partition]!.high)), nothing copied there\n"
                            .utf8))
            }
        }
        return plan
    }

    /// Fewer records reached the shadow topic than were read from the range.
    struct IncompleteCopy: Error, CustomStringConvertible {
        var delivered: Int
        var read: Int
        var description: String {
            "copied \(delivered) of the \(read) requests read: the shadow topic does not hold the whole range"
        }
    }

    struct Copied: Sendable {
        var records = 0
        var requestIDs = Set<String>()
        /// The shadow topic's end per partition once copied.
        var ends: [Int32: Int64] = [:]
    }

    /// Copies the plan's records to the same partitions of `target`, keys, values and headers as
    /// they are; throws when a record was not delivered, or fewer were delivered than read.
    static func copy(
        _ plan: Plan, from topic: String, to target: String, kafka: KafkaConfiguration, timeout: Duration
    ) async throws -> Copied {
        let producer = try KafkaProducer(configuration: kafka)
        let failures = Mutex<[KafkaError]>([])
        let delivered = Atomic<Int>(0)
        let copy: @Sendable (inout Copied, KafkaMessage) -> Void = { copied, message in
            let record = KafkaProducerRecord(
                topic: target, partition: message.partition, key: message.key, value: message.value,
                headers: message.headers)
            while true {
                do throws(KafkaError) {
                    try producer.produce(record) { result in
                        switch result {
                        case .success: delivered.add(1, ordering: .relaxed)
                        case .failure(let error): failures.withLock { $0.append(error) }
                        }
                    }
                    break
                } catch  where error.code == .queueFull {
                    // The producer's queue drains on its own thread: wait for room.
                    usleep(1000)
                } catch {
                    failures.withLock { $0.append(error) }
                    break
                }
            }
            copied.records += 1
            copied.ends[message.partition, default: 0] += 1
            if let id = (try? PurchaseRequestEvent(jsonBytes: message.value))?.requestID {
                copied.requestIDs.insert(id)
            }
        }
        var copied = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, ranges: plan.exact, timeout: timeout, into: Copied(), copy
        ).state
        let cutoff = plan.cutoff
        copied = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, starts: plan.starts, ends: plan.ends, timeout: timeout,
            endsAt: { ($0.timestampMs ?? .max) >= cutoff }, into: copied, copy
        ).state
        try await producer.flush()
        await producer.close()
        if let error = failures.withLock({ $0.first }) { throw error }
        let count = delivered.load(ordering: .relaxed)
        guard count == copied.records else {
            throw IncompleteCopy(delivered: count, read: copied.records)
        }
        // Read back: the shadow topic holds, in each partition, as many records as were copied
        // there (it was empty). A shortfall leaves the read short of its end: it times out.
        let shadow = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: target, starts: copied.ends.mapValues { _ in 0 }, ends: copied.ends,
            timeout: timeout, into: [Int32: Int64]()
        ) { counts, message in counts[message.partition, default: 0] += 1 }.state
        guard shadow == copied.ends else {
            throw IncompleteCopy(delivered: shadow.values.reduce(0) { $0 + Int($1) }, read: copied.records)
        }
        // The shadow topic was empty (checked) and every record was delivered: its end in each
        // partition is the count copied there (some brokers, Tansu, report a shorter end).
        return copied
    }

    /// Production's outcomes of `requestIDs` (the first of each).
    static func recordings(
        of requestIDs: Set<String>, in topic: String, kafka: KafkaConfiguration, timeout: Duration
    ) async throws -> [String: RecordedController.Recording] {
        guard
            let partitions = try await CommonOptions.partitionCount(
                of: topic, described: "outcomes topic", kafka: kafka)
        else { throw UsageError("the outcomes topic '\(topic)' does not exist: nothing to answer from") }
        return try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, partitions: Array(0..<Int32(partitions)), timeout: timeout,
            into: [String: RecordedController.Recording]()
        ) { recordings, message in
            guard let outcome = try? PurchaseOutcomeEvent(jsonBytes: message.value),
                requestIDs.contains(outcome.requestID), recordings[outcome.requestID] == nil
            else { return }
            recordings[outcome.requestID] = RecordedController.Recording(outcome)
        }.state
    }

    /// Runs the processor until its group has committed `ends` of every partition; `false` on timeout.
    static func process(
        _ processor: PurchaseProcessor, until ends: [Int32: Int64], topic: String, group: String,
        kafka: KafkaConfiguration, timeout: Duration
    ) async throws -> Bool {
        var watcherConfiguration = kafka
        watcherConfiguration["group.id"] = group
        let watcher = try KafkaConsumer(configuration: watcherConfiguration)
        let partitions = ends.keys.sorted().map { KafkaTopicPartition(topic: topic, partition: $0) }
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let done = try await withThrowingTaskGroup(of: Bool?.self) { group in
            group.addTask {
                try await processor.run()
                return nil
            }
            group.addTask {
                while ContinuousClock.now < deadline && !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(200))
                    let committed = (try? await watcher.committed(partitions)) ?? []
                    if committed.count == partitions.count
                        && committed.allSatisfy({ $0.offset >= ends[$0.partition]! })
                    {
                        return true
                    }
                }
                return false
            }
            var done = false
            // The watcher ends first (over, or out of time): stop the processor. The processor
            // ending first (a signal) stops the watcher.
            while let result = try await group.next() {
                if let finished = result {
                    done = finished
                    processor.shutdown()
                } else {
                    group.cancelAll()
                }
            }
            return done
        }
        await watcher.close()
        if !done {
            FileHandle.standardError.write(Data("replay: not over within \(timeout) or interrupted\n".utf8))
        }
        return done
    }

    struct Summary {
        let prefix: String
        let requests: Int
        let finished: Bool
        let statistics: ProcessorStatistics
        let recorded: (answered: Int, unrecorded: Int)?

        func text() -> String {
            var lines = ["replay into \(prefix).*: \(requests) requests \(finished ? "replayed" : "NOT all replayed")"]
            lines.append(
                "  outcomes: "
                    + OutcomeResult.allCases.map { "\($0.rawValue) \(statistics.outcomes[$0] ?? 0)" }.joined(
                        separator: ", "))
            if let recorded {
                lines.append(
                    "  answered from production's outcomes: \(recorded.answered); without one (not_attempted): \(recorded.unrecorded); billing calls: 0"
                )
            } else {
                lines.append("  controller calls: \(statistics.controllerCalls)")
            }
            lines.append(
                "  dead letters: \(statistics.deadLetters), entitlement changes: \(statistics.entitlementChanges)")
            lines.append("  compare with production: encore-processor audit --compare \(prefix)")
            return lines.joined(separator: "\n")
        }

        func json() -> String {
            var writer = JSONWriter()
            writer.beginObject()
            writer.field("into", prefix)
            writer.field("requests", requests)
            writer.field("finished", finished)
            writer.key("outcomes")
            writer.beginObject()
            for result in OutcomeResult.allCases {
                writer.key(dynamic: result.rawValue)
                writer.integer(Int64(statistics.outcomes[result] ?? 0))
            }
            writer.endObject()
            writer.field("controller_calls", statistics.controllerCalls)
            if let recorded {
                writer.field("recorded_answers", recorded.answered)
                writer.field("unrecorded", recorded.unrecorded)
            }
            writer.field("dead_letters", statistics.deadLetters)
            writer.field("entitlement_changes", statistics.entitlementChanges)
            writer.endObject()
            return String(decoding: writer.bytes, as: UTF8.self)
        }
    }
}
