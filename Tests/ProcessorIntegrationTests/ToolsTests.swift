import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

@Suite("Load generator and benchmark")
struct ToolsTests {
    @Test("the rate limiter never runs ahead of its rate and sends exactly what the window allowed")
    func rate() async throws {
        let cluster = try EmbeddedKafkaCluster()
        try cluster.createTopic("load", partitions: 4)
        let producer = try KafkaProducer(
            configuration: KafkaConfiguration(["bootstrap.servers": cluster.bootstrapServers]))
        var generator = RequestGenerator(options: RequestGenerator.Options())
        var ahead: [String] = []
        let progress = try await LoadGenerator(producer: producer, topic: "load", rate: 1000).run(
            generator: &generator, count: nil, duration: .seconds(3), interval: .milliseconds(250)
        ) { progress in
            // Never faster than the rate (one record of burst allowed)...
            if Double(progress.sent) > 1000 * progress.elapsed.seconds + 2 {
                ahead.append("\(progress.sent) sent after \(progress.elapsed)")
            }
        }
        await producer.close()
        #expect(ahead.isEmpty, "ahead of the rate: \(ahead)")
        // ...and over the window exactly what the rate allowed: a sender a busy machine woke late
        // catches up on the window's budget, and sends nothing after it (counted, not timed: a
        // loaded machine may wake it seconds late).
        #expect(progress.sent == 3000, "\(progress.sent) records in a 3 s window at 1,000/s")
        #expect(progress.acknowledged == progress.sent && progress.errors == 0)
        withExtendedLifetime(cluster) {}
    }

    @Test("bench runs end to end on the embedded broker and its JSON has every field")
    func benchJSON() async throws {
        let (status, output, error) = try await runBinary(
            ["bench", "--count", "3000", "--partitions", "4", "--users", "300", "--json", "--log-level", "error"],
            timeout: .seconds(120))
        #expect(status == 0, "\(error)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
        for key in [
            "broker", "librdkafka", "count", "partitions", "controller_latency_ms", "max_in_flight", "workers", "users",
            "offered_rate", "processed", "elapsed_s", "throughput", "latency_ms", "cpu_s", "peak_rss_mb",
            "all_committed", "join_s", "ledger", "entitlement_changes",
        ] {
            #expect(object[key] != nil, "missing \(key)")
        }
        let latency = try #require(object["latency_ms"] as? [String: Double])
        #expect(Set(latency.keys) == ["p50", "p90", "p99", "p99.9", "max"])
        #expect(object["processed"] as? Int == 3000 && object["all_committed"] as? Bool == true)
        #expect((object["throughput"] as? Double ?? 0) > 0)
    }

    @Test(
        "bench and demo stop at once, naming the cause, when the broker deleted requests they filled before they were read",
        arguments: [["bench", "--users", "300", "--timeout-s", "120"], ["demo"]])
    func droppedRequests(command: [String]) async throws {
        // The embedded broker keeps about 5 MB of records per partition and deletes the oldest
        // beyond it (some 10,000 requests): 15,000 in one partition do not fit. The dropped requests'
        // outcomes can never come: bench waited out its whole --timeout-s (600 s by default) and
        // demo its 300 s, and then reported fewer, giving no reason.
        let (status, _, error) = try await runBinary(
            command + ["--count", "15000", "--partitions", "1", "--log-level", "error"], timeout: .seconds(400))
        #expect(status == 1, "\(error)")
        #expect(
            error.contains("before they were read") && error.contains("deletes the oldest"), "\(error)")
        #expect(error.contains("--partitions"), "\(error)")
    }

    @Test("bench --no-kafka runs the loop alone and reports every request; a broker option is refused by name")
    func benchWithoutKafka() async throws {
        let (status, output, error) = try await runBinary(
            ["bench", "--no-kafka", "--count", "2000", "--users", "100", "--json", "--log-level", "error"],
            timeout: .seconds(120))
        #expect(status == 0, "\(error)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
        #expect(object["processed"] as? Int == 2000 && object["outcomes"] as? Int == 2000)
        #expect((object["cpu_us_per_request"] as? Double ?? 0) > 0)
        for arguments in [["-X", "linger.ms=1"], ["--rate", "10"], ["--bootstrap-servers", "127.0.0.1:1"]] {
            let refused = try await runBinary(["bench", "--no-kafka"] + arguments)
            #expect(
                refused.0 == 2 && refused.2.contains("\(arguments[0]) does not apply"), "\(arguments): \(refused.2)")
        }
    }
}
