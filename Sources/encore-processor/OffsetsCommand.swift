import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor offsets show|reset`: a group's committed offsets, and moving them (the
/// `kafka-consumer-groups --reset-offsets` habit: a plan first, applied only with `--execute`,
/// never while the group has members).
enum OffsetsCommand {
    static let definition = CommandDefinition(
        name: "offsets",
        summary: "Show a consumer group's offsets, or reset them (dry run unless --execute).",
        usage:
            "offsets (show | reset) --group GROUP --bootstrap-servers HOST:PORT [--topic TOPIC] [--to-datetime TIME | --to-earliest | --to-latest | --shift-by N] [--execute]",
        options: CommonOptions.kafka + [
            .option("group", value: "GROUP", "The consumer group (the processor's --group-id)."),
            .option(
                "topic", value: "TOPIC", default: "encore.purchase-requests", "The topic whose offsets to show or move."
            ),
            .option(
                "to-datetime", value: "TIME", "reset: to the first record at or after TIME (RFC 3339 or epoch ms)."),
            .flag("to-earliest", "reset: to the first record held."),
            .flag("to-latest", "reset: to the end (skip everything not yet read)."),
            .option(
                "shift-by", value: "N",
                "reset: move each partition's offset by N (negative: back), within what is held."),
            .flag("execute", "reset: commit the new offsets (without it, only print the plan).", commandLineOnly: true),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            show prints each partition's committed offset, end and lag. reset prints the plan
            (current -> new) per partition and commits it only with --execute; it refuses while the
            group has members (stop every processor of the group first), and refuses --execute when
            the broker cannot describe groups (librdkafka's mock). A partition without a committed
            offset is shifted from its first record.
            """)

    enum Target {
        case datetime(Int64), earliest, latest, shift(Int64)
    }

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        let action = try options.action(["show", "reset"])
        var kafka = try CommonOptions.clusterConfiguration(options)
        guard let group = options.string("group"), !group.isEmpty else { throw UsageError("--group is required") }
        var targets: [Target] = []
        if let time = options.string("to-datetime") {
            targets.append(.datetime(try CommonOptions.time(time, option: "to-datetime")))
        }
        if options.flag("to-earliest") { targets.append(.earliest) }
        if options.flag("to-latest") { targets.append(.latest) }
        if options.isSet("shift-by") { targets.append(.shift(Int64(try options.integer("shift-by")))) }
        if action == "reset" && targets.count != 1 {
            throw UsageError("reset needs exactly one of --to-datetime, --to-earliest, --to-latest, --shift-by")
        }
        if action == "show" && !targets.isEmpty { throw UsageError("show takes no --to-* or --shift-by") }
        let topic = options.string("topic")!
        if options.endsAtCheck() { return 0 }
        guard let partitionCount = try await CommonOptions.partitionCount(of: topic, described: "topic", kafka: kafka)
        else { return 2 }
        let partitions = (0..<Int32(partitionCount)).map { KafkaTopicPartition(topic: topic, partition: $0) }
        kafka["group.id"] = group
        kafka["enable.auto.commit"] = "false"
        let admin = try KafkaAdmin(configuration: kafka)
        let consumer = try KafkaConsumer(configuration: kafka)
        let status: Int32
        do {
            status = try await perform(
                action == "reset" ? targets.first : nil, group: group, partitions: partitions, admin: admin,
                consumer: consumer, execute: options.flag("execute"))
        } catch {
            await consumer.close()
            throw error
        }
        await consumer.close()
        return status
    }

    /// Shows the offsets (`target` nil) or resets them to `target`.
    static func perform(
        _ target: Target?, group: String, partitions: [KafkaTopicPartition], admin: KafkaAdmin,
        consumer: KafkaConsumer, execute: Bool
    ) async throws -> Int32 {
        let topic = partitions[0].topic
        var current: [Int32: Int64] = [:]
        for entry in try await consumer.committed(partitions) where entry.offset >= 0 {
            current[entry.partition] = entry.offset
        }
        var marks: [Int32: (low: Int64, high: Int64)] = [:]
        for partition in partitions { marks[partition.partition] = try await admin.watermarks(of: partition) }

        guard let target else {
            print("PARTITION  COMMITTED  END  LAG")
            for partition in partitions.map(\.partition) {
                let end = marks[partition]!.high
                let lag = current[partition].map { String(end - $0) } ?? "-"
                print("\(partition)  \(current[partition].map(String.init) ?? "-")  \(end)  \(lag)")
            }
            return 0
        }
        let description = try await admin.describeGroup(group)
        if let description, description.isActive {
            FileHandle.standardError.write(
                Data(
                    "offsets: the group '\(group)' has \(description.members) active members (state \(description.state)): stop them before resetting its offsets\n"
                        .utf8))
            return 1
        }
        var byTime: [Int32: Int64] = [:]
        if case .datetime(let ms) = target {
            for entry in try await admin.offsets(atOrAfter: ms, of: partitions) {
                byTime[entry.partition] = entry.offset
            }
        }
        var plan: [KafkaTopicPartitionOffset] = []
        print("TOPIC  PARTITION  CURRENT  NEW")
        for partition in partitions.map(\.partition) {
            let (low, high) = marks[partition]!
            let new: Int64
            switch target {
            case .earliest: new = low
            case .latest: new = high
            case .datetime: new = byTime[partition].flatMap { $0 >= 0 ? $0 : nil } ?? high
            case .shift(let by): new = min(high, max(low, (current[partition] ?? low) + by))
            }
            print("\(topic)  \(partition)  \(current[partition].map(String.init) ?? "-")  \(new)")
            plan.append(KafkaTopicPartitionOffset(topic: topic, partition: partition, offset: new))
        }
        let rewound = plan.reduce(Int64(0)) { sum, entry in sum + max(0, (current[entry.partition] ?? 0) - entry.offset)
        }
        if rewound > 0 {
            FileHandle.standardError.write(
                Data(
                    "note: \(rewound) records will be processed again; the request journal answers those within --dedupe-retention (7d by default) without a call, older ones are called again\n"
                        .utf8))
        }
        guard execute else {
            FileHandle.standardError.write(Data("dry run: add --execute to commit these offsets\n".utf8))
            return 0
        }
        guard description != nil else {
            // Money is involved: a reset under a running processor is refused, not guessed at.
            FileHandle.standardError.write(
                Data(
                    "offsets: the broker cannot describe consumer groups, so it cannot be made sure that '\(group)' has no members: refusing to reset\n"
                        .utf8))
            return 1
        }
        try await consumer.commit(plan)
        FileHandle.standardError.write(Data("committed \(plan.count) offsets for group '\(group)'\n".utf8))
        return 0
    }
}
