import EncoreEvents
import EncoreTools
import EncoreProcessor
import Foundation
import Kafka
import TestSupport
import Testing

/// Journal v2 on a changelog written by the version before it, on the embedded broker.
@Suite("Journal v2 reads the changelog of the version before it")
struct JournalMigrationTests {
    @Test(
        "state records with the journal inside: their results make re-sent requests duplicates, their open intent one recovery call, journaled in records of its own"
    )
    func readsEarlierChangelog() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        let now = wallClockMs()
        var requests: [(partition: Int32, event: PurchaseRequestEvent)] = []
        for user in 0..<4 {
            var entries: [EntitlementStateRecord.RequestEntry] = []
            for index in 0..<3 {
                let event = PurchaseRequestEvent(
                    requestID: "req-\(user)-\(index)", appID: "app", appUserID: "u\(user)", productID: "pro",
                    store: .appStore, environment: .sandbox, requestedAtMs: now - 60_000)
                requests.append((Int32(user), event))
                // User 0's last request is an open intent: its call may have reached billing.
                let open = user == 0 && index == 2
                entries.append(
                    .init(
                        requestID: event.requestID, attempts: 1, startedAtMs: now - 50_000,
                        result: open ? nil : .purchased, completedAtMs: open ? nil : now - 49_000,
                        offset: Int64(index), digest: event.contentDigest))
            }
            // The earlier format: the user's journal inside the state record.
            let state = EntitlementStateRecord(
                appID: "app", appUserID: "u\(user)", sequence: 0, updatedAtMs: now - 49_000, requests: entries)
            _ = try await producer.send(
                KafkaProducerRecord(
                    topic: Topics.state, partition: Int32(user), key: Array(state.key.utf8), value: state.jsonBytes()))
        }
        // The same requests again, as an upstream re-send, each user's to the user's partition.
        for (partition, event) in requests {
            _ = try await producer.send(
                KafkaProducerRecord(
                    topic: Topics.requests, partition: partition, key: Array(event.key.utf8),
                    value: event.jsonBytes()))
        }
        await producer.close()

        let controller = RecordingController()
        let processor = try processor(bootstrap: bootstrap, group: "migration", maxInFlight: 8, controller: controller)
        async let run: Void = processor.run()
        let finished = try await eventually(timeout: .seconds(180)) {
            try await committedOffsets(bootstrap: bootstrap, group: "migration", topic: Topics.requests, partitions: 4)
                .values.reduce(0, +) == Int64(requests.count)
        }
        #expect(finished)
        processor.shutdown()
        try await run
        let calls = controller.snapshot
        #expect(calls.callsByRequest == ["req-0-2": 1] && calls.recoveryCalls == 1, "\(calls.callsByRequest)")
        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes, partitions: 4).map {
            try PurchaseOutcomeEvent(jsonBytes: $0.value)
        }
        #expect(outcomes.map(\.requestID) == ["req-0-2"] && outcomes.first?.attempts == 2)
        #expect(processor.statistics.duplicates == requests.count - 1)
        // The recovery's intent and result are journal records of their own, beside the old state.
        let journal = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4).filter {
            JournalRecord.isJournalKey($0.key)
        }.map { try JournalRecord(jsonBytes: $0.value) }
        #expect(journal.map(\.entry.requestID) == ["req-0-2", "req-0-2"])
        #expect(journal.map(\.entry.result) == [nil, .purchased] && journal.allSatisfy { $0.entry.attempts == 2 })
        // Once its result was durable, the old entry left u0's state (a restart never reads it back
        // after the newer record's slot is reused); the settled old entries stay until they age out.
        let states = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4).filter {
            !JournalRecord.isJournalKey($0.key) && $0.key == Array("app:u0".utf8)
        }
        let latest = try EntitlementStateRecord(jsonBytes: try #require(states.last).value)
        #expect(states.count == 2 && latest.requests.map(\.requestID) == ["req-0-0", "req-0-1"])
        withExtendedLifetime(cluster) {}
    }
}
