import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

/// The http controller against a Python billing stub: signatures, redirects, big answers, what its
/// errors say, the trace context; and the real binary keeping secrets out of every topic.
@Suite("http controller: signed, no redirects, bounded, no secrets in errors")
struct HTTPControllerTests {
    static let secret = "0123456789abcdef-shared-secret"

    func secretFile(_ text: String) throws -> URL {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("secret-\(UUID())")
        try Data((text + "\n").utf8).write(to: file)
        return file
    }

    func request(_ id: String, traceparent: String? = nil) -> PurchaseRequest {
        PurchaseRequest(
            event: PurchaseRequestEvent(
                requestID: id, appID: "app", appUserID: "u", productID: "p", store: .appStore, environment: .sandbox,
                requestedAtMs: 1),
            traceparent: traceparent)
    }

    func logLines(_ log: URL) throws -> [String] {
        try String(contentsOf: log, encoding: .utf8).split(separator: "\n").map(String.init)
    }

    @Test("calls verify with the shared secret and fail with another; redirects, big bodies and URLs stay out")
    func controller() async throws {
        let file = try secretFile(Self.secret)
        defer { try? FileManager.default.removeItem(at: file) }
        let (billing, port, log) = try await startFakeBilling(secretFile: file)
        defer { Task { await billing.stop() } }
        let base = "http://127.0.0.1:\(port)"
        let signed = HTTPController(
            url: URL(string: "\(base)/purchase")!, timeout: .seconds(10), signingKey: Array(Self.secret.utf8))
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        #expect(try await signed.purchase(request("r-signed", traceparent: traceparent)) == .purchased)
        #expect(try logLines(log).contains("r-signed 1 r-signed sig=ok tp=\(traceparent)"))

        let forged = HTTPController(
            url: URL(string: "\(base)/purchase")!, timeout: .seconds(10), signingKey: Array("another-secret-16b".utf8))
        await #expect(throws: PurchaseControllerError.self) { try await forged.purchase(request("r-forged")) }
        #expect(try logLines(log).contains("r-forged 1 r-forged sig=bad tp=-"))

        let redirected = HTTPController(
            url: URL(string: "\(base)/redirect")!, timeout: .seconds(10), signingKey: Array(Self.secret.utf8))
        do {
            _ = try await redirected.purchase(request("r-redirect"))
            Issue.record("a redirect was answered")
        } catch let error as PurchaseControllerError {
            #expect(error.type == "http_307" && !error.isRetryable && error.message.contains("never followed"))
        }
        #expect(!(try logLines(log)).contains("FOLLOWED"), "the redirect was followed")

        // Credentials and a token in the URL; a 5 MB answer.
        let leaky = HTTPController(
            name: "billing", url: URL(string: "http://user:pa55word@127.0.0.1:\(port)/huge?token=t0ken")!,
            timeout: .seconds(10), signingKey: Array(Self.secret.utf8))
        do {
            _ = try await leaky.purchase(request("r-huge"))
            Issue.record("a 502 was answered")
        } catch let error as PurchaseControllerError {
            #expect(error.type == "http_502" && error.isRetryable && error.isOutcomeUnknown)
            #expect(error.message.count < 300, "\(error.message.count) characters")
            #expect(error.message.contains("controller 'billing' (127.0.0.1:\(port)/huge)"), "\(error.message)")
            #expect(!error.message.contains("pa55word") && !error.message.contains("t0ken"))
        }
        // Nobody listens: the connection error names neither.
        let closed = HTTPController(
            url: URL(string: "http://user:pa55word@127.0.0.1:1/p?token=t0ken")!, timeout: .seconds(5))
        do {
            _ = try await closed.purchase(request("r-closed"))
            Issue.record("a closed port answered")
        } catch let error as PurchaseControllerError {
            // Nothing was sent: retryable, and known not to have reached billing.
            #expect(error.type == "connection" && error.isRetryable && !error.isOutcomeUnknown)
            #expect(!error.message.contains("pa55word") && !error.message.contains("t0ken"), "\(error.message)")
        }
        // A 409: billing still works on a call with this Idempotency-Key. It may charge: unknown, never final.
        let inProgress = HTTPController(
            url: URL(string: "\(base)/in-progress")!, timeout: .seconds(10), signingKey: Array(Self.secret.utf8))
        do {
            let answer = try await inProgress.purchase(request("r-in-progress"))
            Issue.record("/in-progress was answered \(answer)")
        } catch let error as PurchaseControllerError {
            #expect(error.type == "http_409" && error.isRetryable && error.isOutcomeUnknown, "\(error)")
        }
        // A 2xx whose body cannot be read: billing answered and may have charged. Unknown, never final.
        for path in ["garbage", "huge200"] {
            let unreadable = HTTPController(
                url: URL(string: "\(base)/\(path)")!, timeout: .seconds(60), signingKey: Array(Self.secret.utf8))
            do {
                let answer = try await unreadable.purchase(request("r-\(path)"))
                Issue.record("/\(path) was answered \(answer)")
            } catch let error as PurchaseControllerError {
                #expect(error.type == "bad_response" && error.isRetryable && error.isOutcomeUnknown, "\(error)")
            }
        }
    }

    /// 20 requests over 8 users (so both partitions have some), each with its own traceparent.
    func produceTraced(_ bootstrap: String) async throws -> [String: String] {
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        var traces: [String: String] = [:]
        for index in 0..<20 {
            let event = PurchaseRequestEvent(
                requestID: "t-\(index)", appID: "app", appUserID: "u\(index % 8)", productID: "p", store: .appStore,
                environment: .production, requestedAtMs: wallClockMs(),
                entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days))
            let trace = String(format: "00-%032x-%016x-01", index + 1, index + 1)
            traces[event.requestID] = trace
            try await producer.send(
                KafkaProducerRecord(
                    topic: Topics.requests, key: Array(event.key.utf8), value: event.jsonBytes(),
                    headers: [KafkaHeader(key: "traceparent", string: trace)]))
        }
        await producer.close()
        return traces
    }

    @Test("the real binary: signed calls with a header from a file and the trace context; no secret in any topic")
    func binary() async throws {
        let (broker, bootstrap) = try await startBroker(partitions: 2)
        defer { Task { await broker.stop() } }
        let file = try secretFile(Self.secret)
        let token = try secretFile("Bearer tok-\(UUID().uuidString.prefix(8))")
        defer {
            try? FileManager.default.removeItem(at: file)
            try? FileManager.default.removeItem(at: token)
        }
        let (billing, port, log) = try await startFakeBilling(secretFile: file)
        defer { Task { await billing.stop() } }
        let traces = try await produceTraced(bootstrap)
        let arguments = [
            "run", "--bootstrap-servers", bootstrap, "--controller", "http", "--controller-url",
            "http://user:pa55word@127.0.0.1:\(port)/purchase?token=t0ken", "--controller-header",
            "Authorization=@\(token.path)", "--max-attempts", "1", "--log-level", "info",
        ]
        let processor = try ChildProcess(
            try processorBinary(), arguments + ["--group-id", "signed", "--controller-secret-file", file.path])
        #expect(
            try await eventually(timeout: .seconds(180)) {
                // (A partition without records has no committed offset: -1001.)
                try await committedOffsets(bootstrap: bootstrap, group: "signed", topic: Topics.requests, partitions: 2)
                    .values.reduce(0) { $0 + max(0, $1) } == 20
            },
            "\(processor.stderr.suffix(2000))\nbilling: \((try? logLines(log)) ?? [])\n\(billing.stderr.suffix(2000))")
        processor.signal(SIGTERM)
        #expect(await processor.waitForExit() == 0)
        let lines = try logLines(log)
        for (id, trace) in traces {
            // (Ids ending in 7 are answered 503 first: one attempt allowed, so they fail.)
            #expect(lines.contains("\(id) 1 \(id) sig=ok tp=\(trace)"), "\(id)")
        }
        // The trace context rides on every outcome and dead letter too.
        let outputs =
            try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes, partitions: 2)
            + readTopic(bootstrap: bootstrap, topic: Topics.deadLetters, partitions: 2)
        #expect(outputs.count == 22, "20 outcomes and the dead letters of t-7 and t-17")
        for record in outputs {
            let id =
                PurchaseRequestEvent.requestIDHint(record.value)
                ?? (try? DeadLetterEvent(jsonBytes: record.value))?.requestID
            #expect(
                record.header("traceparent") == traces[id ?? ""] && record.header("ce_traceparent") == traces[id ?? ""])
        }
        // And on the entitlement changes the purchases caused.
        let changes = try await readTopic(bootstrap: bootstrap, topic: Topics.entitlements, partitions: 2)
        #expect(!changes.isEmpty)
        for record in changes {
            let change = try EntitlementChangeEvent(jsonBytes: record.value)
            #expect(record.header("traceparent") == traces[change.requestID ?? ""], "\(change)")
        }
        // With the wrong secret (on a second broker), billing refuses every call: failed outcomes
        // and dead letters.
        let (second, secondBootstrap) = try await startBroker(partitions: 2)
        defer { Task { await second.stop() } }
        _ = try await produceTraced(secondBootstrap)
        let wrong = try secretFile("not-the-shared-secret-at-all")
        defer { try? FileManager.default.removeItem(at: wrong) }
        var secondArguments = arguments
        secondArguments[2] = secondBootstrap
        let refused = try ChildProcess(
            try processorBinary(), secondArguments + ["--group-id", "forged", "--controller-secret-file", wrong.path])
        #expect(
            try await eventually(timeout: .seconds(180)) {
                try await committedOffsets(
                    bootstrap: secondBootstrap, group: "forged", topic: Topics.requests, partitions: 2
                )
                .values.reduce(0) { $0 + max(0, $1) } == 20
            })
        refused.signal(SIGTERM)
        #expect(await refused.waitForExit() == 0)
        let forged = try await readTopic(bootstrap: secondBootstrap, topic: Topics.outcomes, partitions: 2).map {
            try PurchaseOutcomeEvent(jsonBytes: $0.value)
        }
        #expect(forged.count == 20 && forged.allSatisfy { $0.result == .failed && $0.error?.type == "http_401" })
        let secrets = ["pa55word", "t0ken", Self.secret, try String(contentsOf: token, encoding: .utf8)]
        for (servers, topic) in [bootstrap, secondBootstrap].flatMap({ servers in Topics.all.map { (servers, $0) } }) {
            for record in try await readTopic(bootstrap: servers, topic: topic, partitions: 2) {
                let text =
                    String(decoding: record.value, as: UTF8.self)
                    + record.headers.map { String(decoding: $0.value ?? [], as: UTF8.self) }.joined()
                for secret in secrets where text.contains(secret.trimmingCharacters(in: .whitespacesAndNewlines)) {
                    Issue.record("a secret reached \(topic): \(text.prefix(300))")
                }
            }
        }
        for output in [processor.stdout, processor.stderr, refused.stdout, refused.stderr] {
            for secret in secrets where output.contains(secret.trimmingCharacters(in: .whitespacesAndNewlines)) {
                Issue.record("a secret reached the logs: \(secret)")
            }
        }
    }
}
