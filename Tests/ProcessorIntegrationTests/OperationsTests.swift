import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing
@testable import encore_processor

#if canImport(Glibc)
    import Glibc
#endif

/// `/metrics`, `/healthz`, `/readyz` and JSON logs: the real binary read by curl and Python, and
/// a stuck loop seen by the health check.
@Suite("Operations: metrics, health, logs")
struct OperationsTests {
    /// `/metrics` parsed by prometheus_client: `name{labels}` → value.
    func metrics(_ base: String) async throws -> [String: Double] {
        let parser = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"),
            ["python3", repositoryRoot.appendingPathComponent("scripts/parse_metrics.py").path, "\(base)/metrics"])
        guard await parser.waitForExit() == 0, case .object(let fields) = try JSONValue.parse(Array(parser.stdout.utf8))
        else { throw TestFailure("cannot parse /metrics: \(parser.stderr)") }
        return fields.compactMapValues { value in
            switch value {
            case .integer(let number): Double(number)
            case .double(let number): number
            default: nil
            }
        }
    }

    /// The operations endpoint's base URL, from the processor's log line that names it.
    func endpoint(of processor: ChildProcess) async throws -> String {
        var base: String? = nil
        _ = await eventually(timeout: .seconds(30)) {
            base = processor.stderr.range(of: "http://127.0.0.1:[0-9]+", options: .regularExpression).map {
                String(processor.stderr[$0])
            }
            return base != nil
        }
        guard let base else { throw TestFailure("no endpoint logged: \(processor.stderr.suffix(2000))") }
        return base
    }

    /// `curl -s -o /dev/null -w '%{http_code}'` with `arguments`.
    func status(_ arguments: [String]) async throws -> String {
        let curl = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"), ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"] + arguments)
        _ = await curl.waitForExit()
        return curl.stdout
    }

    @Test("metrics count what flows, health and readiness answer, the server refuses what it should; logs are JSON")
    func endpoints() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 2)
        defer { Task { await broker.stop() } }
        var options = RequestGenerator.Options()
        options.seed = 71
        options.invalidRatio = 0.1
        let produced = try await produceRequests(bootstrap: bootstrap, count: 100, options: options)
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "observed", "--controller", "simulated",
                "--simulated-latency-ms", "0", "--simulated-outcomes", "purchased=1", "--http-listen", "127.0.0.1:0",
                "--log-format", "json",
            ])
        let base = try await endpoint(of: processor)
        // The first line names the version, brokers, group, guarantee and routes.
        let first = processor.stderr.split(separator: "\n").first ?? ""
        #expect(first.contains("\"msg\":\"encore-processor ") && first.contains("group observed"), "\(first)")
        #expect(
            try await eventually(timeout: .seconds(180)) {
                let now = try await metrics(base)
                return now["encore_requests_received_total{}"] == 100 && now["encore_ready{}"] == 1
            })
        let valid = produced.filter { $0.kind == .valid }.count
        #expect(
            try await eventually(timeout: .seconds(180)) {
                try await metrics(base)["encore_outcomes_total{controller=simulated,result=purchased}"] == Double(valid)
            })
        var seen = try await metrics(base)
        #expect(seen["encore_dead_letters_total{class=missing_field,stage=validate}"] ?? 0 > 0)
        #expect(
            seen.filter { $0.key.hasPrefix("encore_dead_letters_total") }.values.reduce(0, +) == Double(100 - valid))
        #expect(seen["encore_controller_calls_total{}"] == Double(valid))
        #expect(seen["encore_controller_call_seconds_count{}"] == Double(valid))
        #expect(seen["encore_up{}"] == 1 && seen["encore_assigned_partitions{}"] == 2)

        // More requests: the counters move by exactly as many.
        options.seed = 72
        options.invalidRatio = 0
        _ = try await produceRequests(bootstrap: bootstrap, count: 50, options: options)
        #expect(
            try await eventually(timeout: .seconds(180)) {
                try await metrics(base)["encore_outcomes_total{controller=simulated,result=purchased}"]
                    == Double(valid + 50)
            })
        seen = try await metrics(base)
        #expect(seen["encore_requests_received_total{}"] == 150)
        #expect(seen["encore_request_to_outcome_seconds_count{}"] == Double(valid + 50))

        // Lag from librdkafka's statistics (every 5 s): both partitions read to their end.
        #expect(
            try await eventually(timeout: .seconds(30)) {
                let now = try await metrics(base)
                let lags = now.filter { $0.key.hasPrefix("encore_consumer_lag{") }
                return lags.count == 2 && lags.values.allSatisfy { $0 == 0 }
            })
        #expect(try await status(["\(base)/healthz"]) == "200")
        #expect(try await status(["\(base)/readyz"]) == "200")
        #expect(try await status(["\(base)/nothing"]) == "404")
        #expect(try await status(["-X", "POST", "\(base)/metrics"]) == "405")
        #expect(
            try await status(["-H", "X-Big: \(String(repeating: "x", count: 10_000))", "\(base)/metrics"]) == "431")

        // Clients that connect and send nothing hold a slot until the read timeout. One slot short
        // of the cap, they must not delay a health check: it is answered while all are still open.
        let port = Int(base.split(separator: ":").last!)!
        let idle = try (1..<OperationsServer.maximumConnections).map { _ in try TCPClient(port: port) }
        #expect(try TCPClient(port: port).get("/healthz") == "HTTP/1.1 200")
        #expect(
            idle.filter(\.isClosedByServer).isEmpty,
            "idle clients the server had already closed (read timeout \(OperationsServer.readTimeoutSeconds) s)")

        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
        // Every line of the log is one JSON object with ts, level, logger and msg.
        for line in processor.stderr.split(separator: "\n") {
            guard case .object(let fields) = try JSONValue.parse(Array(line.utf8)) else {
                Issue.record("not a JSON object: \(line)")
                continue
            }
            #expect(["ts", "level", "logger", "msg"].allSatisfy { fields[$0] != nil }, "\(line)")
        }
        #expect(processor.stderr.contains("\"msg\":\"dead letter\",\"request_id\":"))
    }

    @Test("probes are answered however many idle clients are connected, and while they keep reconnecting")
    func probesBesideIdleClients() throws {
        let server = try OperationsServer(address: "127.0.0.1:0") { path in
            .init(status: path == "/healthz" ? 200 : 404, body: "ok\n")
        }
        server.start()
        defer { server.stop() }
        // More idle clients than the server keeps waiting: the oldest are shed for the probe.
        var idle = try (0..<(OperationsServer.maximumWaitingConnections + 8)).map { _ in
            try TCPClient(port: server.port)
        }
        for round in 0..<3 {
            #expect(try TCPClient(port: server.port).get("/healthz") == "HTTP/1.1 200", "round \(round)")
            // Half of them reconnect, as a client that reopens its connections does.
            idle.removeFirst(idle.count / 2)
            idle += try (0..<(OperationsServer.maximumWaitingConnections / 2)).map { _ in
                try TCPClient(port: server.port)
            }
        }
    }

    @Test("probes are answered while clients that never read their answers hold every answer slot")
    func probesBesideSlowReaders() throws {
        let large = String(repeating: "x", count: 8 << 20)
        let server = try OperationsServer(address: "127.0.0.1:0") { path in
            .init(status: path == "/healthz" ? 200 : 404, body: path == "/large" ? large : "ok\n")
        }
        server.start()
        defer { server.stop() }
        // Twice as many as there are slots: each asks for 8 MiB and reads none of it.
        let readers = try (0..<(2 * OperationsServer.maximumConnections)).map { _ in
            let client = try TCPClient(port: server.port)
            try client.send("/large")
            return client
        }
        for round in 0..<3 {
            #expect(try TCPClient(port: server.port).get("/healthz") == "HTTP/1.1 200", "round \(round)")
        }
        #expect(readers.count == 2 * OperationsServer.maximumConnections)
    }

    @Test("a dispatch loop stalled by a controller that blocks its thread: /healthz 503, then 200 once it is free")
    func stalledLoop() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 1)
        defer { Task { await broker.stop() } }
        let processor = try ChildProcess(
            try processorBinary(),
            [
                "run", "--bootstrap-servers", bootstrap, "--group-id", "stalled", "--controller", "simulated",
                "--simulated-latency-ms", "0", "--simulated-stalls", "--http-listen", "127.0.0.1:0",
            ])
        let base = try await endpoint(of: processor)
        #expect(try await eventually(timeout: .seconds(180)) { try await status(["\(base)/readyz"]) == "200" })
        let event = PurchaseRequestEvent(
            requestID: "r-stall", appID: "app", appUserID: "u", productID: "p", store: .appStore,
            environment: .sandbox, requestedAtMs: wallClockMs(), attributes: ["simulated_stall_ms": "20000"])
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        try await producer.send(
            KafkaProducerRecord(topic: Topics.requests, key: Array(event.key.utf8), value: event.jsonBytes()))
        await producer.close()
        // The loop is blocked for 20 s; its silence passes the 5 s window, so 503 shows for 15 s (a
        // 4 s window was missed under a loaded suite: the record arrived late and each probe runs
        // curl twice). Both endpoints are read in one probe: a later read could land after the stall.
        #expect(
            try await eventually(timeout: .seconds(45)) {
                let health = try await status(["\(base)/healthz"])
                let readiness = try await status(["\(base)/readyz"])
                return health == "503" && readiness == "503"
            })
        #expect(try await eventually(timeout: .seconds(45)) { try await status(["\(base)/healthz"]) == "200" })
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
    }
}

/// A TCP client of 127.0.0.1, in the test's process (no child process to wait for).
final class TCPClient {
    private let socket: Int32

    init(port: Int) throws {
        socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socket >= 0 else { throw TestFailure("cannot open a socket") }
        // A server that never answers fails the test instead of hanging it.
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            _ = Glibc.close(socket)
            throw TestFailure("cannot connect to port \(port)")
        }
    }

    deinit { _ = Glibc.close(socket) }

    /// Sends `GET path` without reading the answer.
    func send(_ path: String) throws {
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        guard Glibc.send(socket, request, request.count, 0) == request.count else { throw TestFailure("cannot send") }
    }

    /// Sends `GET path` and returns the answer's status line (`HTTP/1.1 200`, without the reason).
    func get(_ path: String) throws -> String {
        try send(path)
        var answer = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(socket, &buffer, buffer.count, 0)
            guard count > 0 else { break }
            answer += buffer.prefix(count)
        }
        return String(decoding: answer.prefix { $0 != 13 }, as: UTF8.self).split(separator: " ").prefix(2)
            .joined(separator: " ")
    }

    /// Whether the server has closed the connection (end of stream readable now).
    var isClosedByServer: Bool {
        var poller = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, 0) == 1 else { return false }
        var byte: UInt8 = 0
        return recv(socket, &byte, 1, Int32(MSG_PEEK)) <= 0
    }
}
