import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

/// Members joining and leaving a running group while calls are slow: the engine's promise with no
/// crash involved, counted exactly.
@Suite("Graceful rebalances with slow calls")
struct GracefulRebalanceTests {
    @Test(
        "members join and leave mid-run with slow calls: no user called twice at once, every repeat explained by a refused hand-over commit, outcomes agree and keep each user's order"
    )
    func joinAndLeave() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 8)
        let bootstrap = cluster.bootstrapServers
        var options = RequestGenerator.Options()
        options.users = 300
        options.seed = 41
        let produced = try await produceRequests(bootstrap: bootstrap, count: 3000, options: options)
        let valid = produced.filter { $0.requestID != nil }
        // Most calls are quick, one in fifteen takes 300 ms: rebalances land while calls run.
        let controller = RecordingController(latency: { request in
            fnv1a(request.requestId) % 15 == 0 ? .milliseconds(300) : .milliseconds(3)
        })
        func member() throws -> PurchaseProcessor {
            try processor(
                bootstrap: bootstrap, group: "graceful-rebalance", maxInFlight: 40, controller: controller,
                kafka: ["session.timeout.ms": "6000", "heartbeat.interval.ms": "300"]
            ) { configuration in
                configuration.callTimeout = .seconds(5)
                configuration.commitInterval = .milliseconds(100)
            }
        }
        let first = try member()
        let firstRun = Task { try await first.run() }
        #expect(await eventually { first.statistics.outcomeCount >= 300 })
        let second = try member()
        let secondRun = Task { try await second.run() }
        #expect(await eventually { second.statistics.assignedPartitions > 0 && second.statistics.outcomeCount > 100 })
        // The first member leaves while calls run; a third joins.
        first.shutdown()
        try await firstRun.value
        let third = try member()
        let thirdRun = Task { try await third.run() }
        #expect(await eventually { third.statistics.assignedPartitions > 0 })
        let committedAll = try await eventually(timeout: .seconds(120)) {
            try await committedOffsets(bootstrap: bootstrap, group: "graceful-rebalance", topic: Topics.requests)
                .values.reduce(0, +) == Int64(produced.count)
        }
        #expect(committedAll)
        second.shutdown()
        third.shutdown()
        try await secondRun.value
        try await thirdRun.value

        // The only repeats allowed: records a member finished after the last commit the broker
        // accepted, when the broker refused its hand-over's commit (librdkafka's mock refuses commits
        // during a rebalance; Kafka takes them). The members count those exactly; a member that gets
        // such a partition back remembers the request ids it answered and skips them as duplicates
        // (the generator made no duplicate ids, so every duplicate skipped is one of those).
        #expect(options.duplicateRatio == 0)
        let members = [first, second, third].map(\.statistics)
        let redone = members.reduce(0) { $0 + $1.redoneAfterHandOver - $1.duplicates }
        let calls = controller.snapshot
        #expect(calls.overlaps.isEmpty, "users with two calls at once: \(calls.overlaps.prefix(10))")
        #expect(
            calls.calls - valid.count == redone,
            "\(calls.calls - valid.count) repeated calls, \(redone) explained by refused hand-over commits")
        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes)
        #expect(
            outcomes.count - valid.count == redone,
            "\(outcomes.count - valid.count) repeated outcomes, \(redone) explained by refused hand-over commits")
        let decoded = try outcomes.map { try PurchaseOutcomeEvent(jsonBytes: $0.value) }
        let results = Dictionary(grouping: decoded, by: \.requestID).mapValues { Set($0.map(\.result)) }
        #expect(results.count == valid.count && results.values.allSatisfy { $0.count == 1 })
        // Each user's outcomes, first occurrences, in the order of the user's requests.
        let requested = try requestIDsByUser(try await readTopic(bootstrap: bootstrap, topic: Topics.requests))
        let answered = try requestIDsByUser(outcomes).mapValues { ids in
            var seen = Set<String>()
            return ids.filter { seen.insert($0).inserted }
        }
        let reordered = requested.filter { answered[$0.key] != $0.value }
        #expect(
            reordered.isEmpty, "users whose outcomes are not in request order: \(reordered.keys.sorted().prefix(5))")
        withExtendedLifetime(cluster) {}
    }
}
