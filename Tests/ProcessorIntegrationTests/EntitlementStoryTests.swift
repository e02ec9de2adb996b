import EncoreEvents
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

/// A scripted story of a few users through the real binary, with a crash in the middle.
@Suite("Entitlement ledger end to end: a story across a crash", .serialized)
struct EntitlementStoryTests {
    static let sources = "encore.entitlement-sources"
    static let partitions: Int32 = 4

    /// Produces records with one producer, so requests and source states of a user share a partition.
    final class Feed: Sendable {
        let producer: KafkaProducer

        init(bootstrap: String) throws {
            producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        }

        func request(_ id: String, user: String, product: String, answer: String, entitlement: Entitlement? = nil)
            async throws
        {
            let event = PurchaseRequestEvent(
                requestID: id, appID: "app", appUserID: user, productID: product, store: .appStore,
                environment: .production, requestedAtMs: wallClockMs(), entitlement: entitlement,
                attributes: ["answer": answer])
            _ = try await producer.send(
                KafkaProducerRecord(topic: Topics.requests, key: Array(event.key.utf8), value: event.jsonBytes()))
        }

        func source(_ user: String, active: Bool, occurredAtMs: Int64, eventID: String) async throws {
            let event = EntitlementSourceEvent(
                appID: "app", appUserID: user, source: "revenuecat", entitlementID: "pro", isActive: active,
                eventID: eventID, occurredAtMs: occurredAtMs)
            _ = try await producer.send(
                KafkaProducerRecord(
                    topic: EntitlementStoryTests.sources, key: Array(event.key.utf8), value: event.jsonBytes()))
        }
    }

    /// Every change published so far, per user, in order, as `kind target status active #sequence`.
    static func changes(_ bootstrap: String) async throws -> [String: [String]] {
        let events = try await readTopic(bootstrap: bootstrap, topic: Topics.entitlements, partitions: partitions).map {
            try EntitlementChangeEvent(jsonBytes: $0.value)
        }
        var byUser: [String: [String]] = [:]
        for change in events {
            let target = change.access.map { "access:\($0)" } ?? change.entitlement.map { $0.type.rawValue } ?? "?"
            let status = change.status.map { " \($0.rawValue)" } ?? ""
            byUser[change.appUserID, default: []].append(
                "\(change.change.rawValue) \(target)\(status) \(change.isActive ? "active" : "inactive") #\(change.sequence)"
            )
        }
        return byUser
    }

    /// Whether every user's changes in `part` begin the user's changes in `whole`.
    static func isPrefix(_ part: [String: [String]], of whole: [String: [String]]) -> Bool {
        part.allSatisfy { user, changes in (whole[user] ?? []).starts(with: changes) }
    }

    static func committedAll(_ bootstrap: String, group: String, topic: String, count: Int64) async throws -> Bool {
        try await eventually(timeout: .seconds(180)) {
            let committed = try await committedOffsets(
                bootstrap: bootstrap, group: group, topic: topic, partitions: partitions)
            // A partition with nothing committed reports a negative offset.
            return committed.values.reduce(0) { $0 + max(0, $1) } == count
        }
    }

    @Test("pending then purchased, a trial that expires while the processor is down, RevenueCat beside a trial")
    func story() async throws {
        let (broker, bootstrap) = try await startBroker(
            partitions: Int(Self.partitions), arguments: ["--sources-topic", Self.sources])
        defer { Task { await broker.stop() } }
        let (billing, port, _) = try await startFakeBilling()
        defer { Task { await billing.stop() } }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-story-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let catalog = directory.appendingPathComponent("catalog.json")
        // A 60-second trial: it ends while the first processor is down. (12, then 30 seconds were too
        // few on a loaded machine: carol's RevenueCat reports were processed after her trial had ended.)
        try Data(
            """
            {"products": {"trial_*": {"type": "freeTrial", "value": 0.000694, "unit": "days"}},
             "access_rules": {"pro": "revenuecat:pro | encore:freeTrial"}}
            """.utf8
        ).write(to: catalog)
        let arguments = [
            "run", "--bootstrap-servers", bootstrap, "--group-id", "story", "--controller", "http",
            "--controller-url", "http://127.0.0.1:\(port)/purchase", "--catalog", catalog.path, "--sources-topic",
            Self.sources, "--log-level", "info", "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500",
        ]
        let feed = try Feed(bootstrap: bootstrap)

        // Act 1: alice's purchase is pending (Ask to Buy); bob and carol start a trial.
        let first = try ChildProcess(try processorBinary(), arguments)
        let discount = Entitlement(type: .discount, value: 20, unit: .percent)
        try await feed.request("a1", user: "alice", product: "premium_yearly", answer: "pending", entitlement: discount)
        try await feed.request("b1", user: "bob", product: "trial_week", answer: "purchased")
        try await feed.request("c1", user: "carol", product: "trial_week", answer: "purchased")
        let act1: [String: [String]] = [
            "alice": ["granted discount provisional active #1"],
            "bob": ["granted freeTrial verified active #1", "granted access:pro active #2"],
            "carol": ["granted freeTrial verified active #1", "granted access:pro active #2"],
        ]
        // Where the story goes once the trials end (on a slow machine that may happen before the crash).
        var expiredTrials = act1
        expiredTrials["bob", default: []] += [
            "expired freeTrial verified inactive #3", "expired access:pro inactive #4",
        ]
        expiredTrials["carol", default: []] += [
            "expired freeTrial verified inactive #3", "expired access:pro inactive #4",
        ]
        let sawAct1 = try await eventually(timeout: .seconds(180)) {
            let changes = try await Self.changes(bootstrap)
            return Self.isPrefix(act1, of: changes) && Self.isPrefix(changes, of: expiredTrials)
        }
        let afterAct1 = try await Self.changes(bootstrap)
        #expect(sawAct1, "\(afterAct1) \(first.stderr.suffix(3000))")
        // RevenueCat reports carol active, then inactive: her trial still gives access, so nothing changes.
        let now = wallClockMs()
        try await feed.source("carol", active: true, occurredAtMs: now, eventID: "rc-1")
        try await feed.source("carol", active: false, occurredAtMs: now + 1, eventID: "rc-2")
        #expect(try await Self.committedAll(bootstrap, group: "story", topic: Self.sources, count: 2))
        #expect(try await Self.committedAll(bootstrap, group: "story", topic: Topics.requests, count: 3))
        let afterSources = try await Self.changes(bootstrap)
        #expect(Self.isPrefix(act1, of: afterSources) && Self.isPrefix(afterSources, of: expiredTrials))

        // The crash, before the trials end.
        first.signal(SIGKILL)
        #expect(await first.waitForExit() != nil)
        let trialEnd = try await readTopic(
            bootstrap: bootstrap, topic: Topics.entitlements, partitions: Self.partitions
        ).compactMap { try EntitlementChangeEvent(jsonBytes: $0.value).expiresAtMs }.max()
        let ended = await eventually(timeout: .seconds(120)) { wallClockMs() > (trialEnd ?? 0) + 500 }
        #expect(ended && trialEnd != nil)

        // Act 2: the restart restores the ledger; the expiries that passed are published once, on start.
        let second = try ChildProcess(try processorBinary(), arguments)
        var expected = expiredTrials
        let sawExpiries = try await eventually(timeout: .seconds(180)) { try await Self.changes(bootstrap) == expected }
        let afterRestart = try await Self.changes(bootstrap)
        #expect(sawExpiries, "\(afterRestart) \(second.stderr.suffix(3000))")
        // Alice's purchase completes; RevenueCat reports carol active again, and a stale report arrives late.
        try await feed.request(
            "a2", user: "alice", product: "premium_yearly", answer: "purchased", entitlement: discount)
        try await feed.source("carol", active: true, occurredAtMs: wallClockMs(), eventID: "rc-3")
        try await feed.source("carol", active: false, occurredAtMs: now - 60_000, eventID: "rc-0")
        expected["alice", default: []] += ["verified discount verified active #2"]
        expected["carol", default: []] += ["granted access:pro active #5"]
        let sawAct2 = try await eventually(timeout: .seconds(180)) { try await Self.changes(bootstrap) == expected }
        let afterAct2 = try await Self.changes(bootstrap)
        #expect(sawAct2, "\(afterAct2) \(second.stderr.suffix(3000))")
        #expect(try await Self.committedAll(bootstrap, group: "story", topic: Self.sources, count: 4))
        #expect(try await Self.committedAll(bootstrap, group: "story", topic: Topics.requests, count: 4))
        second.signal(SIGTERM)
        #expect(await second.waitForExit() == 0, "\(second.stderr.suffix(3000))")
        #expect(second.stderr.contains("restored the ledger state of"), "\(second.stderr.suffix(3000))")
        // Nothing more after a clean stop: no change twice, none lost.
        let final = try await Self.changes(bootstrap)
        #expect(final == expected)

        // Every change follows the contract.
        let values = try await readTopic(bootstrap: bootstrap, topic: Topics.entitlements, partitions: Self.partitions)
            .map(\.value)
        #expect(try await validateWithPython("entitlement-change", values) == nil)
        // The changelog holds the users' states and the request journal's records.
        let changelog = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: Self.partitions)
        let journal = changelog.filter { JournalRecord.isJournalKey($0.key) }.map(\.value)
        #expect(!journal.isEmpty)
        #expect(try await validateWithPython("request-journal", journal) == nil)
        let states = changelog.filter { !JournalRecord.isJournalKey($0.key) }.map(\.value)
        #expect(try await validateWithPython("entitlement-state", states) == nil)

        // The query command reads carol's latest state back from the changelog.
        let query = try ChildProcess(
            try processorBinary(), ["entitlements", "--bootstrap-servers", bootstrap, "--user", "app:carol", "--json"])
        #expect(await query.waitForExit() == 0, "\(query.stderr)")
        let carol = try EntitlementStateRecord(jsonBytes: Array(query.stdout.utf8.dropLast()))
        #expect(carol.sequence == 5 && carol.access == ["pro": true])
        #expect(carol.sources.map(\.eventID) == ["rc-3"] && carol.grants.map(\.isActive) == [false])
        let table = try ChildProcess(
            try processorBinary(), ["entitlements", "--bootstrap-servers", bootstrap, "--user", "app:alice"])
        #expect(await table.waitForExit() == 0)
        #expect(table.stdout.contains("premium_yearly") && table.stdout.contains("discount: all=yes verified=yes"))
        let nobody = try ChildProcess(
            try processorBinary(), ["entitlements", "--bootstrap-servers", bootstrap, "--user", "app:nobody"])
        #expect(await nobody.waitForExit() == 1 && nobody.stderr.contains("no ledger state for 'app:nobody'"))
        await feed.producer.close()
        await billing.stop()
        await broker.stop()
    }
}
