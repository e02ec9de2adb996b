import EncoreEvents
import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor entitlements`: one user's ledger state, read from the changelog.
enum EntitlementsCommand {
    static let definition = CommandDefinition(
        name: "entitlements",
        summary: "Print a user's entitlement state from the ledger's changelog (support, audits).",
        usage: "entitlements --user APP_ID:APP_USER_ID --bootstrap-servers HOST:PORT [options]",
        options: CommonOptions.kafka + [
            .option("user", value: "APP_ID:APP_USER_ID", "The user, as in record keys."),
            .option(
                "state-topic", value: "TOPIC", default: "encore.entitlement-state", "The ledger's changelog topic."),
            .option("timeout-ms", value: "MS", default: "60000", "Give up reading the changelog after this long."),
            .flag("json", "Print the state record as JSON (schemas/entitlement-state.schema.json)."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            Reads the changelog up to its current end and keeps the user's latest record: what the
            processor would restore. The user's partition under Kafka's default partitioner is read
            first, every other one only if the user is not there. Exit status 1 when the ledger has
            no state for the user.
            """)

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        let kafka = try CommonOptions.clusterConfiguration(options)
        guard let user = options.string("user") else { throw UsageError("--user APP_ID:APP_USER_ID is required") }
        guard let colon = user.firstIndex(of: ":"), colon != user.startIndex, colon != user.index(before: user.endIndex)
        else {
            throw UsageError("--user: '\(user)' is not APP_ID:APP_USER_ID")
        }
        let topic = options.string("state-topic")!
        let timeout = try options.milliseconds("timeout-ms", minimum: 1)
        if options.endsAtCheck() { return 0 }
        guard
            let partitions = try await CommonOptions.partitionCount(
                of: topic, described: "changelog topic", kafka: kafka)
        else { return 1 }
        let key = Array(user.utf8)
        // The user's partition under Kafka's default (murmur2) partitioner first; the others only
        // when the requests were partitioned some other way.
        let likely = KafkaPartitioner.murmur2Partition(key: key, partitions: Int32(partitions))
        var (latest, records): ([UInt8]?, Int) = (nil, 0)
        for group in [[likely], (0..<Int32(partitions)).filter { $0 != likely }] where latest == nil && !group.isEmpty {
            let read = try await KafkaPartitionReader.fold(
                configuration: kafka, topic: topic, partitions: group, timeout: timeout, into: [UInt8]?.none
            ) { latest, message in
                if message.key == key { latest = message.value }
            }
            (latest, records) = (read.state, records + read.records)
        }
        guard let value = latest else {
            FileHandle.standardError.write(
                Data("no ledger state for '\(user)' in '\(topic)' (\(records) records read)\n".utf8))
            return 1
        }
        let state = try EntitlementStateRecord(jsonBytes: value)
        if options.flag("json") {
            print(String(decoding: state.jsonBytes(), as: UTF8.self))
        } else {
            print(table(state, nowMs: Int64(Date().timeIntervalSince1970 * 1000)))
        }
        return 0
    }

    /// A human-readable view: grants, the scopes they are active in, other sources, access answers.
    static func table(_ state: EntitlementStateRecord, nowMs: Int64) -> String {
        func time(_ ms: Int64?) -> String { ms.map { CloudEventHeaders.rfc3339(ms: $0) } ?? "-" }
        func isActive(_ grant: EntitlementStateRecord.Grant) -> Bool {
            grant.isActive && (grant.expiresAtMs.map { $0 > nowMs } ?? true)
        }
        var lines = [
            "user \(state.key): \(state.sequence) changes, last updated \(time(state.updatedAtMs))", "",
        ]
        lines.append("Encore grants:")
        if state.grants.isEmpty { lines.append("  (none)") }
        let value = { (entitlement: Entitlement) -> String in
            let number =
                entitlement.value == entitlement.value.rounded()
                ? String(Int64(entitlement.value)) : "\(entitlement.value)"
            return "\(number) \(entitlement.unit.rawValue)"
        }
        lines += formatRows(
            [["PRODUCT", "TYPE", "VALUE", "STATUS", "ACTIVE", "GRANTED", "EXPIRES", "REQUEST"]]
                + state.grants.map { grant in
                    [
                        grant.productID, grant.entitlement.type.rawValue, value(grant.entitlement),
                        grant.status.rawValue, isActive(grant) ? "yes" : "no", time(grant.grantedAtMs),
                        time(grant.expiresAtMs), grant.requestID,
                    ]
                })
        lines += ["", "Active by scope (Encore's EntitlementScope):"]
        for type in EntitlementType.allCases {
            let grants = state.grants.filter { $0.entitlement.type == type && isActive($0) }
            let verified = grants.contains { $0.status == .verified }
            lines.append("  \(type.rawValue): all=\(grants.isEmpty ? "no" : "yes") verified=\(verified ? "yes" : "no")")
        }
        lines += ["", "Other sources:"]
        if state.sources.isEmpty { lines.append("  (none)") }
        lines += formatRows(
            [["SOURCE", "ENTITLEMENT", "ACTIVE", "EXPIRES", "OCCURRED", "EVENT"]]
                + state.sources.map { source in
                    let active = source.isActive && (source.expiresAtMs.map { $0 > nowMs } ?? true)
                    return [
                        source.source, source.entitlementID, active ? "yes" : "no", time(source.expiresAtMs),
                        time(source.occurredAtMs), source.eventID,
                    ]
                })
        lines += ["", "Access rules (last published answer):"]
        if state.access.isEmpty { lines.append("  (none)") }
        for (rule, active) in state.access.sorted(by: { $0.key < $1.key }) {
            lines.append("  \(rule): \(active ? "active" : "inactive")")
        }
        return lines.joined(separator: "\n")
    }

    private static func formatRows(_ rows: [[String]]) -> [String] {
        guard rows.count > 1 else { return [] }
        let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            "  "
                + zip(row, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces)
        }
    }
}
