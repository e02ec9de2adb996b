import Foundation
import TestSupport
import Testing

/// Runs the binary to completion and returns its status and output.
/// Runs the binary to its exit. The deadline is far above what a command takes: under a CPU hog and
/// the whole suite on two cores, a `--check` that printed its error at once was seen to exit only
/// after 30 s (its exit status then read as -1).
func runBinary(
    _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(300)
) async throws -> (Int32, String, String) {
    let child = try ChildProcess(try processorBinary(), arguments, environment: environment)
    let status = await child.waitForExit(timeout: timeout)
    return (status ?? -1, child.stdout, child.stderr)
}

@Suite("Command line")
struct CommandLineTests {
    @Test(
        "every command has --help",
        arguments: [
            "run", "demo", "generate", "topics", "broker", "bench", "entitlements", "dead-letters", "audit", "offsets",
            "loadtest",
        ])
    func help(command: String) async throws {
        let (status, output, _) = try await runBinary([command, "--help"])
        #expect(status == 0)
        #expect(output.contains("Usage: encore-processor \(command)"))
    }

    @Test(
        "a bad flag or value fails at start naming it",
        arguments: [
            (["run", "--max-in-flight", "zero"], "--max-in-flight"),
            (["run", "--max-in-flight", "0"], "--max-in-flight"),
            (["run", "--workers", "0"], "--workers"),
            (["run", "--workers", "4", "--max-in-flight", "2"], "4 workers need"),
            (["run", "--no-such-flag"], "--no-such-flag"),
            (["run", "-X", "no.such.property=1"], "no.such.property"),
            (["run", "-X", "acks=sometimes"], "acks"),
            (["run", "--controller", "carrier-pigeon"], "--controller"),
            (["run", "--controller", "http"], "--controller-url"),
            (["run", "--controller", "http", "--controller-url", "ftp://x"], "--controller-url"),
            (["run", "--controller", "simulated", "--route", "rc_=nobody"], "--route"),
            (["run", "--controller", "simulated", "--simulated-outcomes", "purchased=lots"], "--simulated-outcomes"),
            (["run", "--requests-topic", "bad topic!"], "requests-topic"),
            (["run", "--log-level", "loud"], "--log-level"),
            (["generate", "--count", "10", "--duration", "5"], "--count"),
            (["topics", "create", "--partitions", "-1"], "--partitions"),
            (["frobnicate"], "frobnicate"),
            (["run", "--catalog", "/no/such/catalog.json"], "--catalog: cannot read '/no/such/catalog.json'"),
            (["run", "--access-rule", "pro = encore:gold"], "unknown Encore entitlement 'gold'"),
            (["run", "--access-rule", "pro"], "--access rule 'pro'"),
            (["run", "--state-topic", "encore.purchase-outcomes"], "must all differ"),
            (
                ["run", "--sources-topic", "s", "-X", "partition.assignment.strategy=cooperative-sticky"],
                "partition.assignment.strategy=range"
            ),
            (
                ["run", "--call-timeout-ms", "30000", "--drain-timeout-ms", "10000"],
                "--drain-timeout-ms: must be longer"
            ),
            (["run", "--drain-timeout-ms", "30000"], "--drain-timeout-ms: must be longer than --call-timeout-ms"),
            (
                ["run", "-X", "max.poll.interval.ms=20000"],
                "max.poll.interval.ms: must be longer than the drain timeout"
            ),
            (["loadtest", "--bootstrap-servers", "k:9092", "--duration", "5"], "--rate and --ramp"),
            (
                ["loadtest", "--bootstrap-servers", "k:9092", "--rate", "5", "--ramp", "1:9", "--duration", "5"],
                "--ramp"
            ),
            (["loadtest", "--bootstrap-servers", "k:9092", "--ramp", "fast", "--duration", "5"], "--ramp: 'fast'"),
            (["loadtest", "--bootstrap-servers", "k:9092", "--rate", "5"], "--duration"),
            (
                ["loadtest", "--bootstrap-servers", "k:9092", "--rate", "5", "--duration", "5", "--slo", "p50=3"],
                "--slo"
            ),
            (["loadtest", "--rate", "5", "--duration", "5"], "--bootstrap-servers"),
            (["entitlements", "--bootstrap-servers", "k:9092"], "--user"),
            (["entitlements", "--bootstrap-servers", "k:9092", "--user", "nocolon"], "APP_ID:APP_USER_ID"),
        ])
    func badArguments(arguments: [String], named: String) async throws {
        let (status, _, error) = try await runBinary(arguments)
        #expect(status == 2, "\(error)")
        #expect(error.contains(named), "\(error)")
    }

    @Test("a single-valued flag given twice takes the last value (as wrappers override defaults)")
    func lastValueWins() async throws {
        let (status, _, error) = try await runBinary([
            "run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "simulated", "--max-in-flight", "0",
            "--max-in-flight", "8",
        ])
        #expect(status == 0, "\(error)")
        let (refused, _, message) = try await runBinary([
            "run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "simulated", "--max-in-flight", "8",
            "--max-in-flight", "0",
        ])
        #expect(refused == 2 && message.contains("--max-in-flight"), "\(message)")
    }

    @Test("--check validates a full command line without touching Kafka")
    func check() async throws {
        let (status, output, error) = try await runBinary([
            "run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "http", "--controller-url",
            "rc=http://billing:8080/purchase", "--controller-url", "sk=http://billing:8080/storekit", "--route",
            "rc_=rc",
            "--route", "*=sk", "-X", "security.protocol=plaintext", "--max-in-flight", "512",
        ])
        #expect(status == 0, "\(error)")
        #expect(output.contains("configuration OK"))
    }

    @Test("a catalog with an entry that is not an entitlement fails at start naming the entry")
    func badCatalog() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("catalog-\(UUID()).json")
        try Data(#"{"products": {"rc_*": {"type": "freeTrial", "value": 7, "unit": "weeks"}}}"#.utf8).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let (status, _, error) = try await runBinary(["run", "--check", "--catalog", file.path])
        #expect(status == 2)
        #expect(error.contains("products.rc_*.unit"), "\(error)")
        let good = FileManager.default.temporaryDirectory.appendingPathComponent("catalog-\(UUID()).json")
        try Data(
            #"{"products": {"rc_*": {"type": "freeTrial", "value": 7, "unit": "days"}}, "access_rules": {"pro": "revenuecat:pro | encore:freeTrial"}}"#
                .utf8
        ).write(to: good)
        defer { try? FileManager.default.removeItem(at: good) }
        let (okStatus, output, okError) = try await runBinary([
            "run", "--check", "--catalog", good.path, "--sources-topic", "encore.entitlement-sources", "--controller",
            "simulated", "--embedded-broker",
        ])
        #expect(okStatus == 0 && output.contains("configuration OK"), "\(okError)")
    }

    @Test("ENCORE_BOOTSTRAP_SERVERS stands in for --bootstrap-servers")
    func environment() async throws {
        let (status, _, error) = try await runBinary(
            ["topics", "create", "--check"], environment: ["ENCORE_BOOTSTRAP_SERVERS": "kafka:9092"])
        #expect(status == 0, "\(error)")
        let (missing, _, message) = try await runBinary(
            ["topics", "create", "--check"], environment: ["ENCORE_BOOTSTRAP_SERVERS": ""])
        #expect(missing == 2 && message.contains("--bootstrap-servers"))
    }

    @Test(
        "--check refuses what run would refuse, naming the option",
        arguments: [
            // The drain timeout follows the call timeout, and librdkafka's max.poll.interval.ms follows
            // the drain; derived from a call timeout of 24.8 days, it passes librdkafka's limit of 24 h.
            (["--call-timeout-ms", "2147483647", "--dedupe-retention", "3650d"], "--call-timeout-ms"),
            (["--drain-timeout-ms", "86400000", "--dedupe-retention", "3650d"], "--drain-timeout-ms"),
            (["--group-id", ""], "--group-id"),
            (["-X", "sasl.mechanisms=BOGUS"], "sasl.mechanisms"),
            // librdkafka refuses these only when it creates the client.
            (["-X", "fetch.max.bytes=1"], "fetch.max.bytes"),
            (["-X", "session.timeout.ms=400000"], "session.timeout.ms"),
        ])
    func checkRefusesWhatRunRefuses(extra: [String], named: String) async throws {
        let (status, output, error) = try await runBinary(
            ["run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "simulated"] + extra)
        #expect(status == 2, "\(extra): \(output)")
        #expect(error.contains(named), "\(error)")
        // --print-config validates as --check does: it never prints a configuration run refuses.
        let (printed, printedOutput, printedError) = try await runBinary(
            ["run", "--print-config", "--bootstrap-servers", "kafka:9092", "--controller", "simulated"] + extra)
        #expect(printed == 2 && printedError.contains(named), "\(extra): \(printedOutput)\(printedError)")
    }

    @Test("a config file that is not text is named as such; an error never echoes a terminal escape")
    func unreadableInput() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("config-\(UUID()).bin")
        try Data([0x7F, 0x45, 0x4C, 0x46, 0x02, 0x01, 0x01, 0x00, 0xFF, 0xFE, 0x00, 0xC3]).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let (status, _, error) = try await runBinary(["run", "--check", "--config", file.path])
        #expect(status == 2 && error.contains("not UTF-8 text"), "\(error)")
        let (escaped, _, message) = try await runBinary(
            ["run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "simulated"],
            environment: ["ENCORE_LOG_LEVEL": "\u{1B}[2J\u{1B}[31mloud\u{07}"])
        #expect(escaped == 2 && message.contains("--log-level"), "\(message)")
        #expect(
            !message.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" } && message.contains("\\u{1B}[31mloud"),
            "control characters are shown escaped: \(message.debugDescription)")
    }
}
