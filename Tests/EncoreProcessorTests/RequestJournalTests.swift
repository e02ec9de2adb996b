import EncoreEvents
import Foundation
import Kafka
import TestSupport
import Testing

@testable import EncoreProcessor

/// The request journal: its rules with an injected clock, and what the loop does with a journal
/// restored from the changelog (a restart, a rebalance, a re-send days later).
@Suite("Request journal: intents, results, retention, recovery (no Kafka)", .timeLimit(.minutes(5)))
struct RequestJournalTests {
    static let day: Int64 = 86_400_000
    static let t0: Int64 = 1_764_475_643_000

    func outcome(_ index: Int, user: String = "u", _ result: OutcomeResult, attempts: Int = 1, at ms: Int64)
        -> PurchaseOutcomeEvent
    {
        PurchaseOutcomeEvent(request: request(index, user: user), result: result, attempts: attempts, completedAtMs: ms)
    }

    /// Request 1 of user `u` purchased with a free trial offered: the request and the grant's update.
    func grantTrial(in ledger: inout EntitlementLedger) -> (event: PurchaseRequestEvent, update: LedgerUpdate) {
        var event = request(1, user: "u")
        event.entitlement = Entitlement(type: .freeTrial, value: 7, unit: .days)
        let update = ledger.complete(
            PurchaseOutcomeEvent(request: event, result: .purchased, attempts: 1, completedAtMs: Self.t0),
            entitlement: event.entitlement, partition: 0)
        return (event, update)
    }

    @Test("an intent, then its result: one small journal record each, under the same slot; no state record")
    func intentThenResult() {
        var ledger = EntitlementLedger(catalog: EntitlementCatalog())
        let intent = ledger.recordIntent(request(0, user: "u"), attempt: 1, partition: 3, nowMs: Self.t0)
        #expect(intent.partition == 3 && intent.changes.isEmpty && !intent.writesState)
        #expect(
            intent.journal
                == JournalRecord(
                    appID: "app", appUserID: "u", seq: 0,
                    entry: .init(requestID: "req-0", attempts: 1, startedAtMs: Self.t0)))
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: "req-0")?.result == nil)
        let done = ledger.complete(
            outcome(0, .purchased, attempts: 2, at: Self.t0 + 50), entitlement: nil, partition: 3)
        #expect(!done.writesState, "nothing granted (no entitlement offered): the state is not written")
        #expect(
            done.journal
                == JournalRecord(
                    appID: "app", appUserID: "u", seq: 0,
                    entry: .init(
                        requestID: "req-0", attempts: 2, startedAtMs: Self.t0, result: .purchased,
                        completedAtMs: Self.t0 + 50)))
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: "req-0")?.result == .purchased)
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: "req-1") == nil)
        #expect(ledger.journalEntry(ofUser: "app:v", requestID: "req-0") == nil)
        // The next request of the user takes the next slot.
        #expect(ledger.recordIntent(request(1, user: "u"), attempt: 1, partition: 3, nowMs: Self.t0).journal?.seq == 1)
        // A grant writes the state (without the journal) beside the journal record.
        var granting = EntitlementLedger(catalog: EntitlementCatalog())
        let (event, granted) = grantTrial(in: &granting)
        #expect(granted.writesState && granted.state.grants.count == 1 && granted.state.requests.isEmpty)
        #expect(granted.journal?.entry.result == .purchased)
        // Without grants (--no-ledger) the result is still recorded, and nothing is granted.
        var bare = EntitlementLedger(catalog: EntitlementCatalog())
        let update = bare.complete(
            PurchaseOutcomeEvent(request: event, result: .purchased, attempts: 1, completedAtMs: Self.t0),
            entitlement: event.entitlement, partition: 0, grants: false)
        #expect(update.changes.isEmpty && update.state.grants.isEmpty && !update.writesState)
        #expect(update.journal?.entry.result == .purchased)
    }

    @Test("a journal update holds the user's whole state from the public methods, the identity alone for the worker")
    func journalUpdatesOfTheWorkerHoldNoState() {
        var ledger = EntitlementLedger(catalog: EntitlementCatalog())
        let (event, granted) = grantTrial(in: &ledger)
        #expect(granted.writesState && granted.holdsState && granted.state.grants.count == 1)
        let next = request(2, user: "u")
        let identity = JournalIdentity(user: UserLane(key: "app:u"), requestID: next.requestID)
        let publicIntent = ledger.recordIntent(next, attempt: 1, partition: 0, nowMs: Self.t0 + 1)
        #expect(!publicIntent.writesState && publicIntent.holdsState && publicIntent.state.grants.count == 1)
        let workerIntent = ledger.recordIntent(
            next, attempt: 2, partition: 0, nowMs: Self.t0 + 2, offset: nil, digest: nil, known: identity,
            holdsState: false)
        #expect(!workerIntent.writesState && !workerIntent.holdsState && workerIntent.state.grants.isEmpty)
        #expect(workerIntent.state.key == "app:u" && workerIntent.journal?.entry.attempts == 2)
        // A repeat of the same grant changes nothing: the result is the journal's alone.
        let repeatOutcome = PurchaseOutcomeEvent(
            request: next, result: .purchased, attempts: 2, completedAtMs: Self.t0 + 3)
        let workerResult = ledger.complete(
            repeatOutcome, entitlement: event.entitlement, campaignID: nil, offerID: nil, partition: 0, grants: true,
            known: identity, holdsState: false)
        #expect(!workerResult.writesState && !workerResult.holdsState && workerResult.state.grants.isEmpty)
        #expect(workerResult.journal?.entry.result == .purchased)
        // The user's state itself is untouched.
        #expect(ledger.state(ofUser: "app:u")?.grants.count == 1)
    }

    @Test("past the cap a new request takes the slot of the one cap requests older; past the retention, entries go")
    func retentionAndCap() {
        var ledger = EntitlementLedger(
            catalog: EntitlementCatalog(), journal: JournalPolicy(retentionMs: 7 * Self.day, perUserCap: 3))
        func remembered() -> [String] {
            (0..<8).map { "req-\($0)" }.filter { ledger.journalEntry(ofUser: "app:u", requestID: $0) != nil }
        }
        for index in 0..<3 {
            _ = ledger.complete(outcome(index, .purchased, at: Self.t0 + Int64(index)), entitlement: nil, partition: 0)
        }
        #expect(remembered() == ["req-0", "req-1", "req-2"])
        // The fourth request's intent takes req-0's slot (its record replaces req-0's on the changelog).
        let intent = ledger.recordIntent(request(3, user: "u"), attempt: 1, partition: 0, nowMs: Self.t0 + 3)
        #expect(intent.journal?.seq == 3 && intent.journal?.key(slotCount: 3) == Array(":0:app:u".utf8))
        #expect(remembered() == ["req-1", "req-2", "req-3"])
        _ = ledger.complete(outcome(3, .failed, at: Self.t0 + 4), entitlement: nil, partition: 0)
        #expect(remembered() == ["req-1", "req-2", "req-3"])
        // Seven days on, what was last touched more than seven days before goes.
        let later = Self.t0 + 7 * Self.day + 3
        _ = ledger.complete(outcome(4, .purchased, at: later), entitlement: nil, partition: 0)
        #expect(remembered() == ["req-2", "req-3", "req-4"])
        ledger.pruneJournals(nowMs: later)
        #expect(remembered() == ["req-3", "req-4"], "req-2 was last touched at t0+2, more than 7 days before")
        // Other users are not touched by u's cap.
        _ = ledger.complete(outcome(0, user: "v", .purchased, at: later), entitlement: nil, partition: 0)
        #expect(ledger.journalEntry(ofUser: "app:v", requestID: "req-0") != nil && remembered() == ["req-3", "req-4"])
    }

    @Test(
        "journal records round-trip through the changelog: a restore remembers what the loop did, the latest record of a slot winning"
    )
    func roundTrip() throws {
        var ledger = EntitlementLedger(
            catalog: EntitlementCatalog(), journal: JournalPolicy(retentionMs: 7 * Self.day, perUserCap: 2))
        var records: [JournalRecord] = []
        records.append(
            ledger.complete(outcome(0, .notAttempted, attempts: 0, at: Self.t0), entitlement: nil, partition: 0)
                .journal!)
        records.append(
            ledger.recordIntent(request(1, user: "u"), attempt: 3, partition: 0, nowMs: Self.t0 + 9, digest: "00ff")
                .journal!)
        records.append(
            ledger.recordInDoubt(request(1, user: "u"), attempts: 4, partition: 0, nowMs: Self.t0 + 10).journal!)
        records.append(
            ledger.complete(outcome(2, .purchased, at: Self.t0 + 11), entitlement: nil, partition: 0).journal!)
        var restored = RestoredPartition(journalCap: 2)
        for record in records {
            #expect(try JournalRecord(jsonBytes: record.jsonBytes()) == record)
            try restored.fold(key: record.key(slotCount: 2), value: record.jsonBytes(), horizonMs: .min)
        }
        var second = EntitlementLedger(
            catalog: EntitlementCatalog(), journal: JournalPolicy(retentionMs: 7 * Self.day, perUserCap: 2))
        second.restore(journal: restored.journal, partition: 0)
        for id in ["req-0", "req-1", "req-2"] {
            #expect(
                second.journalEntry(ofUser: "app:u", requestID: id)
                    == ledger.journalEntry(ofUser: "app:u", requestID: id),
                "\(id)")
        }
        #expect(second.journalEntry(ofUser: "app:u", requestID: "req-0") == nil, "req-2 took req-0's slot")
        #expect(second.journalEntry(ofUser: "app:u", requestID: "req-1")?.inDoubtSinceMs == Self.t0 + 10)
        // The next request continues the user's counter.
        #expect(second.recordIntent(request(3, user: "u"), attempt: 1, partition: 0, nowMs: Self.t0).journal?.seq == 3)
    }

    @Test(
        "an earlier version's entry settled by a journal record leaves the state once that record is durable; one superseded at restore at once"
    )
    func legacyEntriesLeaveTheState() throws {
        let open = EntitlementStateRecord.RequestEntry(requestID: "req-0", attempts: 1, startedAtMs: Self.t0)
        let old = EntitlementStateRecord(appID: "app", appUserID: "u", requests: [open])
        var ledger = EntitlementLedger(catalog: EntitlementCatalog())
        ledger.restore(old, partition: 0, nowMs: Self.t0)
        #expect(ledger.takeLegacyCleanups().isEmpty && !ledger.hasLegacySettled)
        // Its recovery's intent supersedes the old entry; it leaves once the result is durable.
        _ = ledger.recordIntent(request(0, user: "u"), attempt: 2, partition: 0, nowMs: Self.t0 + 1)
        #expect(ledger.hasLegacySettled)
        let done = ledger.complete(outcome(0, .purchased, attempts: 2, at: Self.t0 + 2), entitlement: nil, partition: 0)
        #expect(done.state.requests == [open], "not before the result's record is durable")
        #expect(ledger.hasLegacySettled)
        let dropped = ledger.dropLegacyEntry(userKey: "app:u", requestID: "req-0")
        let cleanup = try #require(dropped)
        #expect(cleanup.writesState && cleanup.state.requests.isEmpty && !ledger.hasLegacySettled)
        let again = ledger.dropLegacyEntry(userKey: "app:u", requestID: "req-0")
        #expect(again == nil)
        // A restore that finds a newer record of an old entry writes the state without it at once.
        var restored = RestoredPartition(journalCap: 100)
        let record = try #require(done.journal)
        try restored.fold(key: record.key(slotCount: 100), value: record.jsonBytes(), horizonMs: .min)
        var second = EntitlementLedger(catalog: EntitlementCatalog())
        second.restore(journal: restored.journal, partition: 0)
        second.restore(old, partition: 0, nowMs: Self.t0 + 3)
        let cleanups = second.takeLegacyCleanups()
        #expect(cleanups.count == 1 && cleanups.first?.state.requests.isEmpty == true)
        #expect(second.journalEntry(ofUser: "app:u", requestID: "req-0")?.result == .purchased)
    }

    @Test("an earlier version's journal in a state record is read (migration), under the newer journal records")
    func migratesStateRecordJournal() throws {
        var restored = RestoredPartition(journalCap: 100)
        let newer = JournalRecord(
            appID: "app", appUserID: "u", seq: 0,
            entry: .init(
                requestID: "req-1", attempts: 2, startedAtMs: Self.t0 + 5, result: .purchased,
                completedAtMs: Self.t0 + 6))
        try restored.fold(key: newer.key(slotCount: 100), value: newer.jsonBytes(), horizonMs: .min)
        let old = EntitlementStateRecord(
            appID: "app", appUserID: "u",
            requests: [
                .init(
                    requestID: "req-0", attempts: 1, startedAtMs: Self.t0, result: .cancelled, completedAtMs: Self.t0),
                .init(requestID: "req-1", attempts: 1, startedAtMs: Self.t0 + 5),
            ])
        try restored.fold(key: Array(old.key.utf8), value: old.jsonBytes(), horizonMs: .min)
        var ledger = EntitlementLedger(catalog: EntitlementCatalog())
        ledger.restore(journal: restored.journal, partition: 0)
        for state in restored.states.values { ledger.restore(state, partition: 0, nowMs: Self.t0 + 7) }
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: "req-0")?.result == .cancelled)
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: "req-1")?.result == .purchased, "the newer record wins")
        // Past the retention, an old entry is not taken.
        var late = EntitlementLedger(catalog: EntitlementCatalog(), journal: JournalPolicy(retentionMs: Self.day))
        late.restore(old, partition: 0, nowMs: Self.t0 + 2 * Self.day)
        #expect(late.journalEntry(ofUser: "app:u", requestID: "req-0") == nil)
    }

    // MARK: The loop with a restored journal

    static func restored(_ entries: [EntitlementStateRecord.RequestEntry]) -> [Int32: [EntitlementStateRecord]] {
        [0: [EntitlementStateRecord(appID: "app", appUserID: "u", requests: entries)]]
    }

    @Test("restored with a result: finished without a call, nothing re-emitted, counted as a duplicate")
    func restoredResult() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(
            partitions: 1, finished: [:],
            restored: Self.restored([
                .init(
                    requestID: "req-0", attempts: 1, startedAtMs: currentTimeMs() - 3 * Self.day, result: .purchased,
                    completedAtMs: currentTimeMs() - 3 * Self.day)
            ]))
        // Re-sent three days after it was processed, then a new request of the same user.
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        #expect(await harness.waitForFinished(2))
        #expect(controller.snapshot.callsByRequest == ["req-1": 1])
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-1"])
        #expect(harness.statistics.duplicates == 1)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 2 })
        await harness.stop()
    }

    @Test("restored with an intent and no result: called once, as a recovery, its attempt number continuing")
    func restoredIntent() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(
            partitions: 1, finished: [:],
            // (An hour ago: the earlier call could no longer be running, whatever the margin.)
            restored: Self.restored([.init(requestID: "req-0", attempts: 2, startedAtMs: currentTimeMs() - 3_600_000)]))
        var late = request(0, user: "u")
        // A deadline that passed does not make it "not attempted": an earlier call may have charged.
        late.deadlineAtMs = currentTimeMs() - 1000
        harness.feed(late)
        #expect(await harness.waitForFinished(1))
        let seen = controller.snapshot
        #expect(seen.callsByRequest == ["req-0": 1] && seen.recoveryCalls == 1)
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.result == .purchased && outcome.attempts == 3)
        #expect(harness.statistics.recovered == 1 && harness.statistics.recoveryCalls == 1)
        // The intent was journaled with the new attempt before the call, then the result.
        let journal = harness.producer.journal()
        #expect(journal.map(\.entry.attempts) == [3, 3] && journal.map(\.entry.result) == [nil, .purchased])
        await harness.stop()
    }

    @Test("an assignment that includes a partition still owned keeps the loop's journal, newer than the restore")
    func reassignedOwnedPartitionKeepsJournal() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        // Assigned again while owned, with what the changelog held before req-0 (nothing for u).
        harness.assign(
            partitions: 1, finished: [:], restored: [0: [EntitlementStateRecord(appID: "app", appUserID: "u")]])
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(2))
        #expect(controller.snapshot.calls == 1 && harness.statistics.duplicates == 1)
        await harness.stop()
    }

    @Test("a configuration that would make intents less durable is refused, naming the property")
    func durabilityEnforced() {
        for (key, value) in [("acks", "1"), ("enable.idempotence", "false")] {
            var configuration = ProcessorConfiguration(kafka: KafkaConfiguration([key: value]))
            configuration.groupID = "g"
            #expect {
                try configuration.validate()
            } throws: { error in
                (error as? ProcessorError)?.message.hasPrefix(key) == true
            }
        }
    }

    @Test("a user at the largest cap, with the longest request ids: each journal record stays small, 1,000 remembered")
    func journalAtCap() throws {
        let cap = EntitlementStateRecord.RequestEntry.maximumCount
        var ledger = EntitlementLedger(
            catalog: EntitlementCatalog(), journal: JournalPolicy(retentionMs: Self.day, perUserCap: cap))
        func id(_ index: Int) -> String { String(repeating: "r", count: 240) + String(index) }
        for index in 0...cap {
            var event = request(index, user: "u")
            event.requestID = id(index)
            let update = ledger.recordIntent(event, attempt: 1, partition: 0, nowMs: Self.t0 + Int64(index))
            #expect(try #require(update.journal).jsonBytes().count < 512 && !update.writesState)
            _ = ledger.complete(
                PurchaseOutcomeEvent(
                    request: event, result: .purchased, attempts: 1, completedAtMs: Self.t0 + Int64(index)),
                entitlement: nil, partition: 0)
        }
        #expect(ledger.journalEntry(ofUser: "app:u", requestID: id(0)) == nil, "the 1,001st took the first's slot")
        #expect((1...cap).allSatisfy { ledger.journalEntry(ofUser: "app:u", requestID: id($0)) != nil })
        #expect(ledger.journalFigures.requests == cap)
    }

    @Test(
        "a failure is journaled before its outcome: a restart reading the record again publishes the same outcome, without a call"
    )
    func journaledFailureRepublished() async throws {
        // First process: billing declines (a definite failure).
        let declining = RecordingController(answer: { _ in
            throw PurchaseControllerError.final("card_declined", "the card was declined")
        })
        let first = LoopHarness(router: router(declining))
        first.assign(partitions: 1)
        first.feed(request(0, user: "u"))
        #expect(await eventually { first.producer.outcomes().count == 1 })
        let firstOutcome = try #require(first.producer.outcomes().first)
        #expect(firstOutcome.result == .failed && firstOutcome.error?.type == "card_declined")
        // The changelog: the intent, the failure (written before the outcome), the final result.
        let changelog = first.producer.produced.filter { $0.topic == "encore.entitlement-state" }
        let journal = first.producer.journal()
        #expect(journal.count >= 2 && journal[1].entry.error?.type == "card_declined")
        // "Crash" before the final result: a second process restores up to the failure's record.
        let billing = RecordingController()
        let second = LoopHarness(router: router(billing))
        second.assign(restored: LoopHarness.restore(Array(changelog.prefix(2))), partitions: 1)
        second.feed(request(0, user: "u"))  // the same record, offset 0
        second.feed(request(0, user: "u"))  // a re-send, offset 1
        #expect(await second.waitForFinished(2))
        #expect(billing.snapshot.calls == 0, "asked billing again after a journaled failure")
        #expect(second.producer.outcomes() == [firstOutcome], "the outcome published again differs")
        #expect(second.producer.deadLetters().map(\.failedAtMs) == first.producer.deadLetters().map(\.failedAtMs))
        #expect(second.statistics.republished == 1 && second.statistics.duplicates == 1)
        await second.stop()
    }

    @Test(
        "restored with an intent whose attempts ran out: one recovery call after the hold, and billing's answer is the outcome, never a guessed failure"
    )
    func restoredIntentAttemptsExhausted() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(
            configure: {
                $0.retry = RetryPolicy(maxAttempts: 3)
                $0.callTimeout = .milliseconds(200)
            }, router: router(controller))
        harness.assign(
            partitions: 1, finished: [:],
            restored: Self.restored([
                .init(requestID: "req-0", attempts: 3, startedAtMs: currentTimeMs() - 3_600_000)
            ]))
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 1 && controller.snapshot.recoveryCalls == 1)
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.result == .purchased && outcome.attempts == 4)
        #expect(harness.producer.deadLetters().isEmpty)
        await harness.stop()
    }

    /// A journal record of request `id` of user u: an intent, or with `result` a result.
    static func held(
        _ id: String, seq: Int64 = 0, attempts: Int, result: OutcomeResult? = nil, startedAtMs: Int64 = 5,
        offset: Int64? = nil, inDoubtSinceMs: Int64? = nil, digest: String? = nil
    ) -> JournalRecord {
        JournalRecord(
            appID: "app", appUserID: "u", seq: seq,
            entry: .init(
                requestID: id, attempts: attempts, startedAtMs: startedAtMs, result: result,
                completedAtMs: result == nil ? nil : startedAtMs + 1, offset: offset, inDoubtSinceMs: inDoubtSinceMs,
                digest: digest))
    }

    /// A partition restored from `records` (read to the committed end) in offset order.
    static func restoredPartition(_ records: [JournalRecord]) throws -> RestoredPartition {
        var restored = RestoredPartition(journalCap: JournalPolicy().perUserCap)
        for record in records {
            try restored.fold(
                key: record.key(slotCount: JournalPolicy().perUserCap), value: record.jsonBytes(), horizonMs: .min)
        }
        return restored
    }

    @Test(
        "journal records held past the committed end: each slot's latest one opens its request under its attempt unless what was read has it already; a result there counts as its attempt's intent, never as an answer"
    )
    func heldIntentsTaken() throws {
        typealias Case = (read: [JournalRecord], held: [JournalRecord], taken: Set<String>, expected: [JournalRecord])
        // (The slot of seq 0, a user's cap of requests later.)
        let sameSlot = Int64(JournalPolicy().perUserCap)
        let cases: [String: Case] = [
            "none read: open": (
                [], [Self.held("r", attempts: 1, digest: "d")], ["r"], [Self.held("r", attempts: 1, digest: "d")]
            ),
            "open read at a lower attempt: raised, the read entry's offset, doubt and digest kept": (
                [Self.held("r", attempts: 1, offset: 7, inDoubtSinceMs: 9, digest: "d")], [Self.held("r", attempts: 2)],
                ["r"], [Self.held("r", attempts: 2, offset: 7, inDoubtSinceMs: 9, digest: "d")]
            ),
            "open read at that attempt: unchanged": (
                [Self.held("r", attempts: 2, startedAtMs: 1)], [Self.held("r", attempts: 2, startedAtMs: 8)], [],
                [Self.held("r", attempts: 2, startedAtMs: 1)]
            ),
            "a result read at a later attempt: unchanged": (
                [Self.held("r", attempts: 3, result: .purchased)], [Self.held("r", attempts: 2)], [],
                [Self.held("r", attempts: 3, result: .purchased)]
            ),
            "a result read at an earlier attempt: open again at the later one": (
                [Self.held("r", attempts: 1, result: .purchased)], [Self.held("r", attempts: 2)], ["r"],
                [Self.held("r", attempts: 2)]
            ),
            "an attempt's intent and result held over the previous attempt's intent read: open at that attempt": (
                [Self.held("r", attempts: 1)],
                [Self.held("r", attempts: 2), Self.held("r", attempts: 2, result: .purchased, startedAtMs: 6)], ["r"],
                [Self.held("r", attempts: 2, startedAtMs: 6)]
            ),
            "a result held alone (its intent compacted behind it): open at its attempt, not answered": (
                [], [Self.held("s", seq: 1, attempts: 1, result: .cancelled)], ["s"],
                [Self.held("s", seq: 1, attempts: 1)]
            ),
            "a request whose slot a later request took there: left, as a full read leaves it": (
                [], [Self.held("r", attempts: 1), Self.held("t", seq: sameSlot, attempts: 1)], ["t"],
                [Self.held("t", seq: sameSlot, attempts: 1)]
            ),
        ]
        // (A settled entry is kept compact: its start time is its completion's.)
        func kept(_ entry: EntitlementStateRecord.RequestEntry?) -> String {
            entry.map {
                "\($0.attempts) \($0.result?.rawValue ?? "open from \($0.startedAtMs)") \($0.offset ?? -1) \($0.inDoubtSinceMs ?? -1) \($0.digest ?? "")"
            } ?? "none"
        }
        for (name, test) in cases.sorted(by: { $0.key < $1.key }) {
            var restored = try Self.restoredPartition(test.read)
            #expect(restored.takeHeldIntents(test.held) == test.taken, "\(name)")
            for id in ["r", "s", "t"] {
                let expected = test.expected.first { $0.entry.requestID == id }?.entry
                #expect(
                    kept(restored.journal.entry(userKey: "app:u", requestID: id)) == kept(expected), "\(name): \(id)")
            }
        }
    }

    @Test(
        "an intent held past the committed end raises its request's attempt: the recovery call is attempt 3, never attempt 2 again"
    )
    func heldIntentRecoveredUnderANewAttempt() async throws {
        // Read to the committed end: attempt 1's intent. Held past it: attempt 2's (another owner's
        // recovery call, its transaction committed but left undecided by the broker).
        let old = currentTimeMs() - 3_600_000
        var restored = try Self.restoredPartition([Self.held("req-0", attempts: 1, startedAtMs: old)])
        #expect(restored.takeHeldIntents([Self.held("req-0", attempts: 2, startedAtMs: old + 1)]) == ["req-0"])
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(restored: [0: restored], partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 1 && controller.snapshot.recoveryCalls == 1)
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.result == .purchased && outcome.attempts == 3)
        await harness.stop()
    }

    @Test("a request waiting for a call slot does not hold its partition's hand-over")
    func waitingForSlotLeftToNextOwner() async throws {
        // User a holds the only call slot with retryable failures; b's request waits for the slot.
        let controller = RecordingController(
            latency: { $0.appUserId == "a" ? .milliseconds(100) : .zero },
            answer: { request in
                if request.appUserId == "a" { throw PurchaseControllerError.retryable("busy", "try later") }
                return .purchased
            })
        let harness = LoopHarness(
            configure: {
                $0.maxInFlight = 1
                $0.callTimeout = .milliseconds(200)
                $0.drainTimeout = .milliseconds(300)
                $0.kafka["max.poll.interval.ms"] = "1000"
                $0.retry = RetryPolicy(maxAttempts: 50, initialBackoff: .milliseconds(5), maxBackoff: .milliseconds(10))
            }, router: router(controller))
        harness.assign(partitions: 2)
        harness.feed(request(0, user: "a"), partition: 1)
        #expect(await eventually { controller.snapshot.calls >= 1 })
        harness.feed(request(1, user: "b"), partition: 0)
        #expect(
            await eventually {
                harness.producer.produced.filter { $0.topic == "encore.entitlement-state" }.count >= 2
            })
        // Partition 0 is handed over at once, b left to the next owner (its intent is durable).
        let offsets = await harness.revoke([0])
        #expect(offsets.map(\.offset).allSatisfy { $0 == 0 })
        #expect(!harness.hasEnded, "stopped as if a call were stuck")
        #expect(controller.snapshot.callsByRequest["req-1"] == nil)
        await harness.stop()
    }
}
