import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor state-check`: a local state store compared with the changelog it caches.
enum StateCheckCommand {
    static let definition = CommandDefinition(
        name: "state-check",
        summary: "Compare a local state store with its changelog (exit 1 when one a restore would trust is wrong).",
        usage: "state-check --state-dir DIR --bootstrap-servers HOST:PORT [options]",
        options: CommonOptions.kafka + [
            .option(
                "state-dir", value: "DIR",
                "The --state-dir the processor ran with (its group's store is in DIR/<group-id>)."),
            .option("group-id", value: "ID", default: "encore-processor", "The processor's consumer group."),
            .option(
                "state-topic", value: "TOPIC", default: "encore.entitlement-state", "The ledger's changelog topic."),
            .option(
                "guarantee", value: "MODE", default: "at-least-once",
                "The processor's --guarantee: exactly-once, a restore rebuilds a checkpoint past the changelog's end."),
            .option("timeout-ms", value: "MS", default: "120000", "Give up reading the changelog after this long."),
            .flag("json", "Print the result as one JSON object."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            Opens the store read-only, without its lock, and reads the changelog to its end. Meant for
            a stopped instance's store: beside a running processor, a compaction may remove a file
            under it, and it stops with an error (run it again). For each partition the store
            holds: would a restore trust it (its checkpoint within the changelog, the record just
            before it the one the store saw), and does it hold, key for key, the changelog's latest
            record below its checkpoint? Keys whose records there were compacted away behind a
            later record are counted, not compared. Exit status 1 when a partition a restore would
            trust differs from the changelog; a store a restore would rebuild is reported, not an error;
            2 when the check cannot be made. The changelog is read as committed: exactly-once, a
            transaction left open by a killed instance holds the read until that instance restarts
            (or the broker aborts it after transaction.timeout.ms).
            """)

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        let kafka = try CommonOptions.clusterConfiguration(options)
        guard let stateDir = options.string("state-dir"), stateDir != "none" else {
            throw UsageError("--state-dir DIR is required")
        }
        let group = options.string("group-id")!
        guard !group.isEmpty else { throw UsageError("--group-id must not be empty") }
        let topic = options.string("state-topic")!
        let guarantee = try CommonOptions.guarantee(options)
        let timeout = try options.milliseconds("timeout-ms", minimum: 1)
        let directory = RunCommand.stateDirectory(stateDir, group: group)!
        if options.endsAtCheck() { return 0 }
        guard FileManager.default.fileExists(atPath: directory) else {
            throw UsageError("--state-dir \(stateDir): no store of group '\(group)' in it (\(directory))")
        }
        let check: StateStoreCheck
        do {
            check = try await StateStoreCheck.run(
                directory: directory, group: group, stateTopic: topic, kafka: kafka, guarantee: guarantee,
                timeout: timeout)
        } catch {
            // Exit status 1 is a verdict: a check that could not be made is 2.
            FileHandle.standardError.write(Data("encore-processor: state-check: \(error)\n".utf8))
            return 2
        }
        if options.flag("json") {
            print(try json(check))
        } else {
            print(table(check))
        }
        return check.isSafe ? 0 : 1
    }

    static func table(_ check: StateStoreCheck) -> String {
        var lines = ["state store \(check.directory), built for \(check.builtFor)"]
        if let reason = check.foreignReason { lines.append("a restore would rebuild it whole: \(reason)") }
        lines.append("")
        lines.append("partition  checkpoint  changelog       matching  missing  extra  different  superseded  verdict")
        for partition in check.partitions {
            let changelog = "\(partition.changelogStart)..<\(partition.changelogEnd)"
            lines.append(
                [
                    pad(String(partition.partition), 9), pad(String(partition.checkpoint), 10), pad(changelog, 14),
                    pad(String(partition.matching), 8), pad(String(partition.missing), 7),
                    pad(String(partition.extra), 5),
                    pad(String(partition.different), 9), pad(String(partition.superseded), 10),
                    partition.verdict.rawValue,
                ].joined(separator: "  "))
            if let reason = partition.rebuildReason, check.foreignReason == nil { lines.append("  rebuilt: \(reason)") }
            if let from = partition.rereadFrom, partition.rebuildReason == nil {
                lines.append(
                    "  read again from offset \(from) by the next restore (an earlier one read it only to a committed end there): compared below it"
                )
            }
            for example in partition.examples { lines.append("  \(example)") }
        }
        if check.partitions.isEmpty { lines.append("(the store holds no partition)") }
        lines.append("")
        lines.append(
            check.isSafe
                ? "no partition a restore would trust differs from the changelog"
                : "a partition a restore would trust differs from the changelog")
        return lines.joined(separator: "\n")
    }

    private static func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : String(repeating: " ", count: width - text.count) + text
    }

    static func json(_ check: StateStoreCheck) throws -> String {
        let partitions: [[String: Any]] = check.partitions.map { partition in
            var object: [String: Any] = [
                "partition": partition.partition, "checkpoint": partition.checkpoint,
                "changelog_start": partition.changelogStart, "changelog_end": partition.changelogEnd,
                "matching": partition.matching, "missing": partition.missing, "extra": partition.extra,
                "different": partition.different, "superseded": partition.superseded,
                "verdict": partition.verdict.rawValue, "examples": partition.examples,
            ]
            if let reason = partition.rebuildReason { object["rebuild_reason"] = reason }
            if let from = partition.rereadFrom { object["reread_from"] = from }
            return object
        }
        var object: [String: Any] = [
            "directory": check.directory, "built_for": check.builtFor, "safe": check.isSafe, "partitions": partitions,
        ]
        if let reason = check.foreignReason { object["foreign_reason"] = reason }
        return String(
            decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }
}
