import Foundation
import Testing

/// Runs the binary to completion and returns its status and output.
func runBinary(
    _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(30)
) async throws -> (Int32, String, String) {
    let child = try ChildProcess(try processorBinary(), arguments, environment: environment)
    let status = await child.waitForExit(timeout: timeout)
    return (status ?? -1, child.stdout, child.stderr)
}

@Suite("Command line")
struct CommandLineTests {
    @Test("every command has --help", arguments: ["run", "demo", "generate", "topics", "broker", "bench"])
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
            (["run", "--no-such-flag"], "--no-such-flag"),
            (["run", "-X", "no.such.property=1"], "no.such.property"),
            (["run", "-X", "acks=sometimes"], "acks"),
            (["run", "--controller", "carrier-pigeon"], "--controller"),
            (["run", "--controller", "http"], "--controller-url"),
            (["run", "--controller", "http", "--controller-url", "ftp://x"], "--controller-url"),
            (["run", "--route", "rc_=nobody"], "--route"),
            (["run", "--simulated-outcomes", "purchased=lots"], "--simulated-outcomes"),
            (["run", "--requests-topic", "bad topic!"], "requests-topic"),
            (["run", "--log-level", "loud"], "--log-level"),
            (["generate", "--count", "10", "--duration", "5"], "--count"),
            (["topics", "create", "--partitions", "-1"], "--partitions"),
            (["frobnicate"], "frobnicate"),
        ])
    func badArguments(arguments: [String], named: String) async throws {
        let (status, _, error) = try await runBinary(arguments)
        #expect(status == 2, "\(error)")
        #expect(error.contains(named), "\(error)")
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

    @Test("ENCORE_BOOTSTRAP_SERVERS stands in for --bootstrap-servers")
    func environment() async throws {
        let (status, _, error) = try await runBinary(
            ["topics", "create", "--check"], environment: ["ENCORE_BOOTSTRAP_SERVERS": "kafka:9092"])
        #expect(status == 0, "\(error)")
        let (missing, _, message) = try await runBinary(
            ["topics", "create", "--check"], environment: ["ENCORE_BOOTSTRAP_SERVERS": ""])
        #expect(missing == 2 && message.contains("--bootstrap-servers"))
    }
}
