import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// Polls `condition` until it holds or `timeout` passes.
/// The `encore-processor` binary built next to the test bundle.
func processorBinary() throws -> URL {
    if let path = ProcessInfo.processInfo.environment["ENCORE_PROCESSOR_BINARY"] { return URL(fileURLWithPath: path) }
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<4 {
        let candidate = directory.appendingPathComponent("encore-processor")
        if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
        directory = directory.deletingLastPathComponent()
    }
    let fallback = repositoryRoot.appendingPathComponent(".build/debug/encore-processor")
    guard FileManager.default.isExecutableFile(atPath: fallback.path) else {
        throw TestFailure("encore-processor binary not found; run swift build first")
    }
    return fallback
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A child process with its output captured to files.
final class ChildProcess: Sendable {
    let process: Process
    /// Where its output goes (and, unless the test gives it one, its state store).
    let directory: URL
    let stdoutURL: URL
    let stderrURL: URL

    /// A new directory for a child's files: ``init(_:_:environment:in:)`` takes it over, and it
    /// goes with the child.
    static func newDirectory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-child-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// Starts `executable`; its files go in `directory` (by default a new one), removed with it.
    init(_ executable: URL, _ arguments: [String], environment: [String: String] = [:], in directory: URL? = nil)
        throws
    {
        self.directory = try directory ?? Self.newDirectory()
        stdoutURL = self.directory.appendingPathComponent("stdout")
        stderrURL = self.directory.appendingPathComponent("stderr")
        _ = FileManager.default.createFile(atPath: stdoutURL.path, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
        process = Process()
        process.executableURL = executable
        process.arguments = arguments
        var merged = ProcessInfo.processInfo.environment
        merged.merge(environment) { $1 }
        // Each child its own state store (`run` defaults to ./state), unless the test shares one.
        if merged["ENCORE_STATE_DIR"] == nil {
            merged["ENCORE_STATE_DIR"] = self.directory.appendingPathComponent("state").path
        }
        process.environment = merged
        process.standardOutput = try FileHandle(forWritingTo: stdoutURL)
        process.standardError = try FileHandle(forWritingTo: stderrURL)
        try process.run()
    }

    deinit {
        // A test that failed half-way leaves no process behind, and no test leaves its files.
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(at: directory)
    }

    var stdout: String { (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// Waits for a line of standard output starting with `prefix`; returns the rest of it.
    func waitForLine(prefix: String, timeout: Duration = .seconds(30)) async throws -> String {
        var found: String? = nil
        _ = await eventually(timeout: timeout) {
            found = stdout.split(separator: "\n").first { $0.hasPrefix(prefix) }.map {
                String($0.dropFirst(prefix.count))
            }
            return found != nil || !process.isRunning
        }
        guard let found else { throw TestFailure("no '\(prefix)' line; stderr: \(stderr.suffix(2000))") }
        return found
    }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Waits for the process to end; `nil` when it is still running after `timeout`.
    func waitForExit(timeout: Duration = .seconds(60)) async -> Int32? {
        guard await eventually(timeout: timeout, { !process.isRunning }) else { return nil }
        return process.terminationStatus
    }

    func stop() async {
        if process.isRunning {
            signal(SIGKILL)
            _ = await waitForExit(timeout: .seconds(10))
        }
    }
}

/// `encore-processor broker`: an embedded broker in its own process, so processors can be killed.
func startBroker(partitions: Int = 8, arguments: [String] = []) async throws -> (ChildProcess, String) {
    let broker = try ChildProcess(try processorBinary(), ["broker", "--partitions", String(partitions)] + arguments)
    let servers = try await broker.waitForLine(prefix: "bootstrap.servers=")
    return (broker, servers)
}

enum Topics {
    static let requests = "encore.purchase-requests"
    static let outcomes = "encore.purchase-outcomes"
    static let deadLetters = "encore.dead-letters"
    static let entitlements = "encore.entitlement-changes"
    static let state = "encore.entitlement-state"
    static let all = [requests, outcomes, entitlements, deadLetters, state]
}

/// Produces `count` generated requests; returns the records in production order.
func produceRequests(
    bootstrap: String, count: Int, options: RequestGenerator.Options, topic: String = Topics.requests
) async throws -> [RequestGenerator.Record] {
    let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
    var generator = RequestGenerator(options: options)
    var records: [RequestGenerator.Record] = []
    for _ in 0..<count {
        let record = generator.next(nowMs: wallClockMs())
        records.append(record)
        try producer.produce(KafkaProducerRecord(topic: topic, key: record.key, value: record.value)) { _ in }
    }
    try await producer.flush()
    await producer.close()
    return records
}

/// Reads every record of `topic` up to its current end, without joining a group.
func readTopic(bootstrap: String, topic: String, partitions: Int32 = 8) async throws -> [KafkaMessage] {
    let configuration = KafkaConfiguration(["bootstrap.servers": bootstrap, "group.id": "reader-\(UUID())"])
    let admin = try KafkaAdmin(configuration: configuration)
    var ends: [Int32: Int64] = [:]
    var total: Int64 = 0
    for partition in 0..<partitions {
        // What is held: from the low watermark (a broker may have dropped older records) to the end.
        let (low, high) = try await admin.watermarks(of: KafkaTopicPartition(topic: topic, partition: partition))
        ends[partition] = high
        total += high - low
    }
    let consumer = try KafkaConsumer(configuration: configuration)
    try consumer.assign((0..<partitions).map { KafkaTopicPartitionOffset(topic: topic, partition: $0, offset: -2) })
    var messages: [KafkaMessage] = []
    if total > 0 {
        for await event in consumer.events {
            guard case .messages(let batch) = event else { continue }
            messages += batch.filter { $0.offset < ends[$0.partition] ?? 0 }
            if messages.count >= Int(total) { break }
        }
    }
    await consumer.close()
    return messages.sorted { ($0.partition, $0.offset) < ($1.partition, $1.offset) }
}

/// Reads `topic` as a `read_committed` consumer until `count` records came (or `timeout`
/// passed): what committed transactions hold. (Control records take offsets without being
/// delivered, so the watermarks cannot tell where to stop.)
func readCommitted(
    bootstrap: String, topic: String, partitions: Int32, count: Int, timeout: Duration = .seconds(60)
) async throws -> [KafkaMessage] {
    let configuration = KafkaConfiguration([
        "bootstrap.servers": bootstrap, "group.id": "reader-\(UUID())", "isolation.level": "read_committed",
    ])
    let consumer = try KafkaConsumer(configuration: configuration)
    try consumer.assign((0..<partitions).map { KafkaTopicPartitionOffset(topic: topic, partition: $0, offset: -2) })
    let read = Mutex<[KafkaMessage]>([])
    let reading = Task {
        for await event in consumer.events {
            guard case .messages(let batch) = event else { continue }
            read.withLock { $0 += batch }
        }
    }
    _ = await eventually(timeout: timeout) { read.withLock { $0.count } >= count }
    await consumer.close()
    reading.cancel()
    await reading.value
    return read.withLock { $0 }.sorted { ($0.partition, $0.offset) < ($1.partition, $1.offset) }
}

/// The total number of records in `topic` (sum of high watermarks).
func recordCount(bootstrap: String, topic: String, partitions: Int32 = 8) async throws -> Int64 {
    let admin = try KafkaAdmin(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
    var total: Int64 = 0
    for partition in 0..<partitions {
        total += try await admin.watermarks(of: KafkaTopicPartition(topic: topic, partition: partition)).high
    }
    return total
}

/// The group's committed offsets of `topic`, by partition.
func committedOffsets(bootstrap: String, group: String, topic: String, partitions: Int32 = 8) async throws -> [Int32:
    Int64]
{
    let consumer = try KafkaConsumer(
        configuration: KafkaConfiguration(["bootstrap.servers": bootstrap, "group.id": group]))
    let committed = try await consumer.committed(
        (0..<partitions).map { KafkaTopicPartition(topic: topic, partition: $0) })
    await consumer.close()
    return Dictionary(uniqueKeysWithValues: committed.map { ($0.partition, $0.offset) })
}

/// Starts `scripts/fake_billing.py`; returns it, the port it listens on and its call log (removed
/// with it).
/// With `secretFile`, calls whose signature does not verify are answered 401.
func startFakeBilling(delayMs: Int = 0, secretFile: URL? = nil) async throws -> (ChildProcess, String, URL) {
    let directory = try ChildProcess.newDirectory()
    let log = directory.appendingPathComponent("billing.log")
    let billing = try ChildProcess(
        URL(fileURLWithPath: "/usr/bin/env"),
        [
            "python3", repositoryRoot.appendingPathComponent("scripts/fake_billing.py").path, "--log", log.path,
            "--delay-ms", String(delayMs),
        ] + (secretFile.map { ["--secret", $0.path] } ?? []), in: directory)
    let port = try await billing.waitForLine(prefix: "port=")
    return (billing, port, log)
}

/// Validates record values with the independent Python validator; returns its output on failure.
/// The blocking wait happens on a dispatch thread, never on the cooperative pool other tests share.
func validateWithPython(_ event: String, _ values: [[UInt8]]) async throws -> String? {
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("encore-\(event)-\(UUID()).jsonl")
    try Data(values.map { String(decoding: $0, as: UTF8.self) }.joined(separator: "\n").utf8).write(to: file)
    defer { try? FileManager.default.removeItem(at: file) }
    let validator = try ChildProcess(
        URL(fileURLWithPath: "/usr/bin/env"),
        [
            "python3", repositoryRoot.appendingPathComponent("scripts/validate_events.py").path, "check", event,
            file.path,
        ])
    let status = await validator.waitForExit(timeout: .seconds(120))
    return status == 0 ? nil : validator.stdout + validator.stderr
}

/// An embedded cluster with the processor's topics.
func embeddedClusterWithTopics(partitions: Int) throws -> EmbeddedKafkaCluster {
    try TestCluster(topics: Dictionary(uniqueKeysWithValues: Topics.all.map { ($0, partitions) })).cluster
}

/// A processor in `group` whose every product goes to a simulated store.
func simulatedProcessor(
    bootstrap: String, group: String, latency: Duration, maxInFlight: Int,
    weights: [(answer: SimulatedController.Answer, weight: Double)] = [(.purchased, 1)], seed: UInt64 = 1,
    kafka: [String: String] = [:], configure: (inout ProcessorConfiguration) -> Void = { _ in }
) throws -> PurchaseProcessor {
    try processor(
        bootstrap: bootstrap, group: group, maxInFlight: maxInFlight,
        controller: SimulatedController(meanLatency: latency, weights: weights, seed: seed), kafka: kafka,
        configure: configure)
}

/// A processor in `group` whose every product goes to `controller`.
func processor(
    bootstrap: String, group: String, maxInFlight: Int, controller: any PurchaseController,
    kafka: [String: String] = [:], configure: (inout ProcessorConfiguration) -> Void = { _ in }
) throws -> PurchaseProcessor {
    var properties = kafka
    properties["bootstrap.servers"] = bootstrap
    var configuration = ProcessorConfiguration(kafka: KafkaConfiguration(properties))
    configuration.groupID = group
    configuration.maxInFlight = maxInFlight
    configure(&configuration)
    var router = PurchaseRouter()
    router.register("controller", controller)
    router.route(.any, to: "controller")
    return try PurchaseProcessor(configuration: configuration, router: router)
}

/// Request ids per user (`app_id:app_user_id`) in the order of `messages` (a user's records share
/// a partition, so its order is offset order).
func requestIDsByUser(_ messages: [KafkaMessage]) throws -> [String: [String]] {
    var byUser: [String: [String]] = [:]
    for message in messages.sorted(by: { ($0.partition, $0.offset) < ($1.partition, $1.offset) }) {
        guard let object = try? JSONValue.parse(message.value), case .object(let fields) = object,
            case .string(let id)? = fields["request_id"], case .string(let app)? = fields["app_id"],
            case .string(let user)? = fields["app_user_id"]
        else { continue }
        byUser["\(app):\(user)", default: []].append(id)
    }
    return byUser
}
