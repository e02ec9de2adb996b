import EncoreEvents
import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor dead-letters list|redrive`: what was dead-lettered, and sending it back.
enum DeadLettersCommand {
    static let definition = CommandDefinition(
        name: "dead-letters",
        summary: "List dead letters, or redrive them to their original topic (dry run by default).",
        usage: "dead-letters (list | redrive) --bootstrap-servers HOST:PORT [filters] [options]",
        options: CommonOptions.kafka + [
            .option(
                "dead-letter-topic", value: "TOPIC", default: "encore.dead-letters", "The dead-letter topic."),
            .option("from", value: "TIME", "Only dead letters that failed at or after TIME (RFC 3339 or epoch ms)."),
            .option("to", value: "TIME", "Only dead letters that failed before TIME."),
            .option("stage", value: "STAGE", "Only this stage (decode, validate, controller, ...)."),
            .option("class", value: "CLASS", "Only this error class (e.g. missing_field, timeout)."),
            .option("timeout-ms", value: "MS", default: "60000", "Give up reading the topic after this long."),
            .flag("json", "list: one JSON object per line (the dead letter and where it is)."),
            .flag(
                "execute", "redrive: produce the records (without it, print what would be produced).",
                commandLineOnly: true),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            Reads the dead-letter topic to its current end. redrive produces each matching dead
            letter's original key, value and headers to its original topic and partition, with a
            header encore_redriven_from=TOPIC/PARTITION/OFFSET naming the dead letter; a dead letter
            whose original was cut (original_*_truncated) is skipped. The request journal makes a
            redrive safe to repeat: a request whose result is journaled is not called again.
            """)

    struct Found {
        let partition: Int32
        let offset: Int64
        let letter: DeadLetterEvent
    }

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        let action = try options.action(["list", "redrive"])
        let kafka = try CommonOptions.clusterConfiguration(options)
        let from = try options.string("from").map { try CommonOptions.time($0, option: "from") }
        let to = try options.string("to").map { try CommonOptions.time($0, option: "to") }
        let stage = options.string("stage")
        if let stage, DeadLetterEvent.Stage(rawValue: stage) == nil {
            throw UsageError(
                "--stage: '\(stage)' is not one of \(DeadLetterEvent.Stage.allCases.map(\.rawValue).joined(separator: ", "))"
            )
        }
        let errorClass = options.string("class")
        let topic = options.string("dead-letter-topic")!
        let timeout = try options.milliseconds("timeout-ms", minimum: 1)
        if options.endsAtCheck() { return 0 }
        guard
            let partitions = try await CommonOptions.partitionCount(
                of: topic, described: "dead-letter topic", kafka: kafka)
        else { return 2 }
        let read = try await KafkaPartitionReader.fold(
            configuration: kafka, topic: topic, partitions: Array(0..<Int32(partitions)), timeout: timeout,
            into: [Found]()
        ) { found, message in
            guard let letter = try? DeadLetterEvent(jsonBytes: message.value),
                from.map({ letter.failedAtMs >= $0 }) ?? true, to.map({ letter.failedAtMs < $0 }) ?? true,
                stage.map({ letter.error.stage.rawValue == $0 }) ?? true,
                errorClass.map({ letter.error.errorClass == $0 }) ?? true
            else { return }
            found.append(Found(partition: message.partition, offset: message.offset, letter: letter))
        }
        let found = read.state.sorted {
            ($0.letter.failedAtMs, $0.partition, $0.offset) < ($1.letter.failedAtMs, $1.partition, $1.offset)
        }
        if action == "list" {
            list(found, topic: topic, json: options.flag("json"))
            FileHandle.standardError.write(Data("\(found.count) of \(read.records) dead letters match\n".utf8))
            return 0
        }
        return try await redrive(found, topic: topic, kafka: kafka, execute: options.flag("execute"))
    }

    static func list(_ found: [Found], topic: String, json: Bool) {
        for item in found {
            let letter = item.letter
            if json {
                // (Topic names are [a-zA-Z0-9._-]: nothing to escape.)
                var writer = "{\"dead_letter\":{\"topic\":\"\(topic)\",\"partition\":\(item.partition),"
                writer += "\"offset\":\(item.offset)},\"letter\":"
                print(writer + String(decoding: letter.jsonBytes(), as: UTF8.self) + "}")
            } else {
                let message =
                    letter.error.message.count > 60
                    ? letter.error.message.prefix(57) + "..." : letter.error.message[...]
                print(
                    "\(CloudEventHeaders.rfc3339(ms: letter.failedAtMs))  \(letter.error.stage.rawValue)/\(letter.error.errorClass)  \(letter.requestID ?? "-")  \(letter.originalTopic)[\(letter.originalPartition)]@\(letter.originalOffset)  \(message)"
                )
            }
        }
    }

    static func redrive(
        _ found: [Found], topic: String, kafka: KafkaConfiguration, execute: Bool
    ) async throws -> Int32 {
        let producer = execute ? try KafkaProducer(configuration: kafka) : nil
        var produced = 0
        var skipped = 0
        for item in found {
            let letter = item.letter
            let origin = "\(topic)/\(item.partition)/\(item.offset)"
            guard !letter.originalValueTruncated, !letter.originalKeyTruncated, !letter.originalHeadersTruncated,
                let value = letter.originalValue.bytes
            else {
                print("skip \(origin): its original was cut when it was dead-lettered")
                skipped += 1
                continue
            }
            let key = letter.originalKey.flatMap(\.bytes)
            var headers = (letter.originalHeaders ?? []).map { KafkaHeader(key: $0.key, value: $0.value?.bytes) }
            headers.append(KafkaHeader(key: "encore_redriven_from", string: origin))
            let target = "\(letter.originalTopic)[\(letter.originalPartition)]"
            guard let producer else {
                print("would produce \(origin) to \(target) (request \(letter.requestID ?? "-"))")
                continue
            }
            try await producer.send(
                KafkaProducerRecord(
                    topic: letter.originalTopic, partition: letter.originalPartition, key: key, value: value,
                    headers: headers))
            print("produced \(origin) to \(target) (request \(letter.requestID ?? "-"))")
            produced += 1
        }
        await producer?.close()
        let summary =
            execute
            ? "\(produced) redriven, \(skipped) skipped"
            : "\(found.count - skipped) would be redriven, \(skipped) skipped (dry run: add --execute)"
        FileHandle.standardError.write(Data((summary + "\n").utf8))
        return 0
    }
}
