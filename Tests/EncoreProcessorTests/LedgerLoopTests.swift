import EncoreEvents
import Foundation
import Kafka
import TestSupport
import Testing

@testable import EncoreProcessor

/// The ledger inside the processor's loop, against fakes: write order, commits, restore, sources.
@Suite("Dispatcher: entitlement changes and the ledger's changelog (no Kafka)")
struct LedgerLoopTests {
    static let trial = Entitlement(type: .freeTrial, value: 7, unit: .days)
    static let sources = "encore.entitlement-sources"

    static func harness(rules: [String] = [], answer: PurchaseResult = .purchased) throws -> LoopHarness {
        var catalog = EntitlementCatalog()
        for rule in rules { catalog.add(try AccessRule.parse(rule)) }
        var router = PurchaseRouter()
        router.register("store", RecordingController(answer: { _ in answer }))
        router.route(.any, to: "store")
        return LoopHarness(
            configure: {
                $0.catalog = catalog
                $0.sourcesTopic = Self.sources
            }, router: router)
    }

    static func trialRequest(_ index: Int, user: String) -> PurchaseRequestEvent {
        var event = request(index, user: user, product: "trial_week")
        event.entitlement = trial
        return event
    }

    @Test("the changelog record is written only after the change events are acknowledged, and the offset after it")
    func writeOrder() async throws {
        let harness = try Self.harness(rules: ["pro = encore:freeTrial"])
        harness.producer.hold("encore.entitlement-changes")
        harness.assign(partitions: 1, finished: [:], alsoOf: [Self.sources])
        harness.feed(Self.trialRequest(0, user: "u1"))
        // The outcome is out and the first change is handed over, unacknowledged (the second waits
        // behind it: one change of a user in flight at a time): no state, no commit.
        #expect(await eventually { harness.producer.outcomes().count == 1 })
        #expect(
            await eventually {
                harness.producer.handedOver.filter { $0.topic == "encore.entitlement-changes" }.count == 1
            })
        try await Task.sleep(for: .milliseconds(300))
        // Only the intent's journal record, written before the call; not the state with the grant,
        // nor the result.
        let early = harness.producer.handedOver.filter { $0.topic == "encore.entitlement-state" }
        #expect(early.count == 1 && early.allSatisfy { JournalRecord.isJournalKey($0.key) })
        #expect(early.map { try! JournalRecord(jsonBytes: $0.value).entry.result } == [nil])
        #expect((harness.consumer.snapshot.stored.values.max() ?? 0) == 0)
        harness.producer.release("encore.entitlement-changes")
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 1 })
        let produced = harness.producer.produced
        // Acknowledgements arrive in `produced` order: had the state been written before the held
        // changes were acknowledged, its record would stand before them.
        let stateIndex = try #require(produced.lastIndex { $0.topic == "encore.entitlement-state" })
        #expect(produced.lastIndex { $0.topic == "encore.entitlement-changes" }.map { $0 < stateIndex } == true)
        let changes = produced.filter { $0.topic == "encore.entitlement-changes" }.map {
            try! EntitlementChangeEvent(jsonBytes: $0.value)
        }
        #expect(changes.map(\.sequence) == [1, 2] && changes.map(\.access) == [nil, "pro"])
        #expect(changes.allSatisfy { $0.key == "app:u1" })
        let changelog = produced.filter { $0.topic == "encore.entitlement-state" }
        // The intent, then the state with the grant, then the result (after the state: a durable
        // result means a durable grant), all to the user's partition.
        #expect(
            changelog.map(\.key) == [Array(":0:app:u1".utf8), Array("app:u1".utf8), Array(":0:app:u1".utf8)]
                && changelog.allSatisfy { $0.partition == 0 })
        let state = try EntitlementStateRecord(jsonBytes: changelog[1].value)
        #expect(state.sequence == 2 && state.access == ["pro": true] && state.grants.count == 1)
        #expect(state.requests.isEmpty, "the journal is in records of its own")
        #expect(harness.producer.journal().map(\.entry.result) == [nil, .purchased])
        // Change events carry a CloudEvents id naming user, sequence and a digest of the content.
        let changeRecords = produced.filter { $0.topic == "encore.entitlement-changes" }
        let ids = changeRecords.compactMap { $0.headers.first { $0.key == "ce_id" }?.stringValue }
        #expect(
            ids
                == changeRecords.map {
                    "entitlement:app:u1:\(try! EntitlementChangeEvent(jsonBytes: $0.value).sequence):\(OutputEncoderTests.fnv1aHex($0.value))"
                })
        #expect(
            ids.first?.hasPrefix("entitlement:app:u1:1:") == true
                && ids.last?.hasPrefix("entitlement:app:u1:2:") == true)
        await harness.stop()
    }

    @Test("a restored user continues its sequence; a repeated grant publishes nothing but still commits")
    func restoredState() async throws {
        let harness = try Self.harness()
        let grant = EntitlementStateRecord.Grant(
            productID: "trial_week", entitlement: Self.trial, status: .provisional, isActive: true,
            grantedAtMs: currentTimeMs(), expiresAtMs: currentTimeMs() + 86_400_000, requestID: "old")
        harness.assign(
            partitions: 1, finished: [:],
            restored: [0: [EntitlementStateRecord(appID: "app", appUserID: "u1", sequence: 7, grants: [grant])]])
        harness.feed(Self.trialRequest(0, user: "u1"))  // purchased: verifies the provisional grant
        harness.feed(Self.trialRequest(1, user: "u1"))  // the same again: nothing observable
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 2 })
        let changes = harness.producer.produced.filter { $0.topic == "encore.entitlement-changes" }.map {
            try! EntitlementChangeEvent(jsonBytes: $0.value)
        }
        #expect(changes.map(\.change) == [.verified] && changes.map(\.sequence) == [8])
        // Each request journals its intent and its result; the state is written once, for the one
        // request that changed it (the second grants nothing new).
        let journal = harness.producer.journal()
        #expect(
            journal.map { "\($0.entry.requestID):\($0.entry.result?.rawValue ?? "intent")" }
                == ["req-0:intent", "req-0:purchased", "req-1:intent", "req-1:purchased"], "\(journal)")
        #expect(harness.producer.states().map(\.sequence) == [8])
        #expect(harness.statistics.entitlementChanges == 1)
        await harness.stop()
    }

    @Test("source states are applied in order, stale ones ignored, invalid ones dead-lettered; offsets commit")
    func sourceRecords() async throws {
        let harness = try Self.harness(rules: ["pro = revenuecat:pro"])
        harness.assign(partitions: 1, finished: [:], alsoOf: [Self.sources])
        func source(_ active: Bool, at ms: Int64, _ id: String) -> [UInt8] {
            EntitlementSourceEvent(
                appID: "app", appUserID: "u1", source: "revenuecat", entitlementID: "pro", isActive: active,
                eventID: id, occurredAtMs: ms
            ).jsonBytes()
        }
        harness.feed(source(true, at: 1000, "e1"), key: "app:u1", topic: Self.sources)
        harness.feed(source(false, at: 500, "e0"), key: "app:u1", topic: Self.sources)  // stale
        harness.feed(Array("{\"app_id\": 1}".utf8), key: "app:u1", topic: Self.sources)
        harness.feed(source(false, at: 2000, "e2"), key: "app:u1", topic: Self.sources)
        #expect(
            await eventually {
                harness.consumer.snapshot.stored[KafkaTopicPartition(topic: Self.sources, partition: 0)] == 4
            })
        let changes = harness.producer.produced.filter { $0.topic == "encore.entitlement-changes" }.map {
            try! EntitlementChangeEvent(jsonBytes: $0.value)
        }
        #expect(changes.map(\.change) == [.granted, .revoked] && changes.map(\.isActive) == [true, false])
        #expect(changes.first?.sources?.first?.source == "revenuecat")
        let letters = harness.producer.deadLetters()
        #expect(letters.count == 1 && letters.first?.originalTopic == Self.sources)
        // Fields are checked in schema order: the first at fault is named.
        #expect(
            letters.first?.error.message == "wrong_type at 'app_id': 'app_id' must be a string, got integer",
            "\(letters)")
        #expect(harness.statistics.sourceEvents == 3)
        await harness.stop()
    }

    @Test("an expiry due at restore is published on the next tick, with no record behind it")
    func expiryOnTick() async throws {
        let harness = try Self.harness(rules: ["pro = encore:freeTrial"])
        let past = currentTimeMs() - 60_000
        let grant = EntitlementStateRecord.Grant(
            productID: "trial_week", entitlement: Self.trial, status: .verified, isActive: true,
            grantedAtMs: past - 1000, expiresAtMs: past, requestID: "r")
        harness.assign(
            partitions: 2, finished: [:],
            restored: [
                1: [
                    EntitlementStateRecord(
                        appID: "app", appUserID: "u9", sequence: 2, updatedAtMs: past - 1000, grants: [grant],
                        access: ["pro": true])
                ]
            ])
        #expect(
            await eventually {
                harness.producer.produced.filter { $0.topic == "encore.entitlement-state" }.count == 1
            })
        let changes = harness.producer.produced.filter { $0.topic == "encore.entitlement-changes" }.map {
            try! EntitlementChangeEvent(jsonBytes: $0.value)
        }
        #expect(changes.map(\.change) == [.expired, .expired] && changes.map(\.sequence) == [3, 4])
        #expect(changes.first?.effectiveAtMs == past)
        let state = harness.producer.produced.first { $0.topic == "encore.entitlement-state" }
        #expect(state?.partition == 1)
        await harness.stop()
    }
}
