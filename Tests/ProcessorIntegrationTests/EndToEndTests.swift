import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

@Suite("Processor end to end on the embedded broker")
struct EndToEndTests {
    @Test(
        "10,000 requests, 8 partitions, 500 users, two workers: one outcome each, per-user order, dead letters, offsets at the end"
    )
    func tenThousand() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 8)
        let bootstrap = cluster.bootstrapServers
        var options = RequestGenerator.Options()
        options.users = 500
        options.invalidRatio = 0.01
        options.duplicateRatio = 0.01
        options.seed = 42
        let produced = try await produceRequests(bootstrap: bootstrap, count: 10_000, options: options)

        let processor = try simulatedProcessor(
            bootstrap: bootstrap, group: "e2e", latency: .milliseconds(1), maxInFlight: 64,
            weights: [(.purchased, 0.7), (.cancelled, 0.2), (.pending, 0.1)], seed: 3
        ) { $0.workers = 2 }
        async let running: Void = processor.run()
        let done = await eventually(timeout: .seconds(120)) { processor.statistics.finished >= 10_000 }
        processor.shutdown()
        try await running
        #expect(done, "finished \(processor.statistics.finished) of 10000")

        // Exactly one outcome per distinct valid request.
        let requests = try await readTopic(bootstrap: bootstrap, topic: Topics.requests)
        #expect(requests.count == 10_000)
        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes)
        let decoded = try outcomes.map { try PurchaseOutcomeEvent(jsonBytes: $0.value) }
        let validIDs = Set(produced.filter { $0.kind != .duplicate }.compactMap(\.requestID))
        #expect(decoded.count == validIDs.count)
        #expect(Set(decoded.map(\.requestID)) == validIDs)
        #expect(Set(decoded.map(\.result)).isSubset(of: [.purchased, .cancelled, .pending]))

        // Per-user order: a user's outcomes appear in the order of their requests.
        var requestOrder: [String: [String]] = [:]
        for message in requests {
            guard let event = try? PurchaseRequestEvent(jsonBytes: message.value) else { continue }
            if !(requestOrder[event.key]?.contains(event.requestID) ?? false) {
                requestOrder[event.key, default: []].append(event.requestID)
            }
        }
        var outcomeOrder: [String: [String]] = [:]
        for outcome in outcomes.map({ try! PurchaseOutcomeEvent(jsonBytes: $0.value) }) {
            outcomeOrder[outcome.key, default: []].append(outcome.requestID)
        }
        #expect(outcomeOrder == requestOrder)
        // And each outcome sits in one partition per user, keyed by the user.
        #expect(outcomes.allSatisfy { String(decoding: $0.key ?? [], as: UTF8.self).hasPrefix("app_demo:user-") })

        // Every invalid record is a dead letter naming its reason.
        let letters = try await readTopic(bootstrap: bootstrap, topic: Topics.deadLetters).map {
            try DeadLetterEvent(jsonBytes: $0.value)
        }
        let invalid = requests.filter { (try? PurchaseRequestEvent(jsonBytes: $0.value)) == nil }
        #expect(letters.count == invalid.count)
        #expect(invalid.count == produced.filter { if case .invalid = $0.kind { true } else { false } }.count)
        for letter in letters {
            let original = try #require(
                requests.first { $0.partition == letter.originalPartition && $0.offset == letter.originalOffset })
            #expect(letter.originalValue.bytes == original.value)
            do {
                _ = try PurchaseRequestEvent(jsonBytes: original.value)
                Issue.record("dead-lettered a valid record")
            } catch {
                #expect(letter.error.errorClass == error.code.name)
            }
        }
        #expect(Set(letters.map(\.error.errorClass)).count >= 6, "reasons: \(Set(letters.map(\.error.errorClass)))")

        // Offsets are committed at the end of every partition.
        let committed = try await committedOffsets(bootstrap: bootstrap, group: "e2e", topic: Topics.requests)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        for partition in Int32(0)..<8 {
            let end = try await admin.watermarks(of: KafkaTopicPartition(topic: Topics.requests, partition: partition))
                .high
            #expect(committed[partition] == end, "partition \(partition)")
        }

        // The independent validator accepts what was produced.
        #expect(try await validateWithPython("purchase-outcome", outcomes.map(\.value)) == nil)
        #expect(
            try await validateWithPython(
                "dead-letter", try await readTopic(bootstrap: bootstrap, topic: Topics.deadLetters).map(\.value)) == nil
        )
        withExtendedLifetime(cluster) {}
    }
}

extension EndToEndTests {
    @Test(
        "exactly-once with two workers: each commits its own transactions; a read_committed reader sees one outcome per request, in per-user order"
    )
    func exactlyOnceTwoWorkers() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        var options = RequestGenerator.Options()
        options.users = 200
        options.seed = 7
        let produced = try await produceRequests(bootstrap: bootstrap, count: 3000, options: options)

        let processor = try simulatedProcessor(
            bootstrap: bootstrap, group: "e2e-eos", latency: .milliseconds(1), maxInFlight: 64
        ) {
            $0.workers = 2
            $0.guarantee = .exactlyOnce
        }
        async let running: Void = processor.run()
        let done = await eventually(timeout: .seconds(300)) { processor.statistics.finished >= 3000 }
        processor.shutdown()
        try await running
        #expect(done, "finished \(processor.statistics.finished) of 3000")
        #expect(processor.statistics.transactions >= 2)

        // Read as a read_committed consumer of the outcomes would. (The mock cluster also shows
        // aborted records to such readers: what this checks is one outcome per request, in order,
        // with each worker's deliveries routed back to it, or its requests would never finish.)
        let outcomes = try await readCommitted(bootstrap: bootstrap, topic: Topics.outcomes, partitions: 4, count: 3000)
        let decoded = try outcomes.map { try PurchaseOutcomeEvent(jsonBytes: $0.value) }
        #expect(decoded.count == 3000)
        #expect(Set(decoded.map(\.requestID)) == Set(produced.compactMap(\.requestID)))
        var outcomeOrder: [String: [String]] = [:]
        for outcome in decoded { outcomeOrder[outcome.key, default: []].append(outcome.requestID) }
        var requestOrder: [String: [String]] = [:]
        for record in produced {
            guard let event = try? PurchaseRequestEvent(jsonBytes: record.value) else { continue }
            requestOrder[event.key, default: []].append(event.requestID)
        }
        #expect(outcomeOrder == requestOrder)
        // Nothing is left for a read_committed reader beyond the outcomes read (no second copy).
        let again = try await readCommitted(
            bootstrap: bootstrap, topic: Topics.outcomes, partitions: 4, count: 3001, timeout: .seconds(3))
        #expect(again.count == 3000)
        // Both workers' last transactions committed: none was left open to abort.
        #expect(processor.statistics.abortedTransactions == 0)
        withExtendedLifetime(cluster) {}
    }

    /// A transaction left open holds back every `read_committed` reader of its partitions until
    /// `transaction.timeout.ms`, unless its producer aborts it (or a producer with the same
    /// `transactional.id` starts). (The mock cluster keeps no abort markers: what this checks is
    /// that the broker accepted the worker's abort.)
    @Test("exactly-once: a worker that fails with its transaction open aborts it as it stops")
    func exactlyOnceFailureAborts() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 1)
        var options = RequestGenerator.Options()
        options.users = 3
        options.seed = 3
        _ = try await produceRequests(bootstrap: cluster.bootstrapServers, count: 3, options: options)
        // From now on every produce is refused for good (TOPIC_AUTHORIZATION_FAILED): the first
        // intent fails in the worker's open transaction.
        cluster.pushRequestErrors(apiKey: 0, Array(repeating: KafkaError.Code(rawValue: 29), count: 1000))
        let processor = try simulatedProcessor(
            bootstrap: cluster.bootstrapServers, group: "e2e-eos-abort", latency: .zero, maxInFlight: 4
        ) {
            $0.workers = 1
            $0.guarantee = .exactlyOnce
        }
        let error = await TopicCheckTests.failure(of: processor)
        #expect(error?.code == .outputLost, "\(String(describing: error))")
        #expect(processor.statistics.controllerCalls == 0, "called though its intent was never written")
        #expect(processor.statistics.abortedTransactions == 1)
        withExtendedLifetime(cluster) {}
    }
}

@Suite("Topic checks at start")
struct TopicCheckTests {
    static func failure(of processor: PurchaseProcessor) async -> ProcessorError? {
        do {
            try await processor.run()
            return nil
        } catch {
            return error
        }
    }

    @Test("refuses to run when the ledger's changelog is not co-partitioned with the requests")
    func coPartitioning() async throws {
        let cluster = try EmbeddedKafkaCluster()
        try cluster.createTopic(Topics.requests, partitions: 4)
        try cluster.createTopic(Topics.state, partitions: 2)
        let processor = try simulatedProcessor(
            bootstrap: cluster.bootstrapServers, group: "copartition", latency: .zero, maxInFlight: 1)
        let error = await Self.failure(of: processor)
        #expect(error?.code == .invalidConfiguration)
        #expect(
            error?.message
                == "state-topic: 'encore.entitlement-state' has 2 partitions but 'encore.purchase-requests' has 4; they must be co-partitioned (same key, same partition count) so one member owns all of a user's records"
        )
    }

    @Test("refuses to run when the sources topic is not co-partitioned with the requests")
    func sourcesCoPartitioning() async throws {
        // (The mock broker creates any topic asked about, so a missing topic cannot be shown here.)
        let cluster = try EmbeddedKafkaCluster()
        try cluster.createTopic(Topics.requests, partitions: 2)
        try cluster.createTopic(Topics.state, partitions: 2)
        try cluster.createTopic("encore.entitlement-sources", partitions: 3)
        let processor = try simulatedProcessor(
            bootstrap: cluster.bootstrapServers, group: "sources", latency: .zero, maxInFlight: 1
        ) { $0.sourcesTopic = "encore.entitlement-sources" }
        let error = await Self.failure(of: processor)
        #expect(error?.message.hasPrefix("sources-topic: 'encore.entitlement-sources' has 3 partitions") == true)
    }
}

@Suite("Ledger restore failure", .timeLimit(.minutes(3)))
struct RestoreFailureTests {
    @Test("a changelog that cannot be read stops the processor rather than overwrite the users' state")
    func unreadableChangelog() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 2)
        // Every ListOffsets (the changelog's watermarks) is refused: TOPIC_AUTHORIZATION_FAILED. As
        // many as no run can use up: librdkafka asks again within each query's timeout, and 200 ran
        // out once on a loaded machine (the restore then read the changelog, and the run went on).
        cluster.pushRequestErrors(apiKey: 2, Array(repeating: KafkaError.Code(rawValue: 29), count: 100_000))
        let processor = try simulatedProcessor(
            bootstrap: cluster.bootstrapServers, group: "restore-failure", latency: .zero, maxInFlight: 1)
        let error = await TopicCheckTests.failure(of: processor)
        #expect(
            error?.message.hasPrefix("cannot restore the ledger state from 'encore.entitlement-state'") == true,
            "\(String(describing: error))")
        #expect(processor.statistics.received == 0)
    }
}
