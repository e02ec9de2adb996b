import EncoreEvents
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

@testable import EncoreProcessor

/// Requests whose effect is unknown: in doubt (`pending`, `outcome_unknown`), reconciled with
/// recovery calls until billing answers, their users' lanes held meanwhile; across a restart; and
/// expired for a person when billing never answers. Billing is ``OutageBilling``: during its outage
/// it charges each request on its first call and answers nothing.
@Suite("In doubt: pending, reconciled, never failed (no Kafka)", .timeLimit(.minutes(5)))
struct InDoubtTests {
    /// Short timeouts, two attempts, quick asks: every verdict below holds at any speed (a slow
    /// machine only makes more calls time out, which is what the outage does anyway).
    static func configure(_ configuration: inout ProcessorConfiguration) {
        configuration.callTimeout = .milliseconds(100)
        configuration.retry = RetryPolicy(
            maxAttempts: 2, initialBackoff: .milliseconds(5), maxBackoff: .milliseconds(20))
        configuration.reconciliation = ReconcilePolicy(
            maxInterval: .milliseconds(200), initialInterval: .milliseconds(50), clockSkewMargin: .zero)
    }

    static let users = ["a", "b", "c", "d", "e", "f"]

    /// Two requests per user: request `i` of user `users[i % 6]`, the first six first.
    static func requests() -> [PurchaseRequestEvent] {
        (0..<12).map { request($0, user: users[$0 % users.count]) }
    }

    /// A loop on partition 0 whose billing is in its outage, fed ``requests()``: returns once each
    /// user's first request is in doubt (whether that happened is expected here).
    static func inDoubtHarness(_ billing: OutageBilling) async -> LoopHarness {
        let harness = LoopHarness(configure: Self.configure, router: router(billing))
        harness.assign(partitions: 1)
        for request in requests() { harness.feed(request) }
        #expect(await eventually(timeout: .seconds(120)) { harness.statistics.inDoubtOpen == users.count })
        return harness
    }

    /// What billing charged must be every request's final outcome, published once, after at most
    /// one `pending` (`outcome_unknown`) of the same request; nothing `failed`.
    static func expectOutcomesMatchBilling(
        _ outcomes: [PurchaseOutcomeEvent], _ billing: OutageBilling.State, requests: [PurchaseRequestEvent]
    ) {
        #expect(!outcomes.contains { $0.result == .failed }, "an outcome says failed: \(outcomes)")
        for request in requests {
            let mine = outcomes.filter { $0.requestID == request.requestID }
            let finals = mine.filter { !$0.isInDoubt }
            #expect(finals.count == 1, "\(request.requestID): \(finals.count) final outcomes")
            #expect(
                finals.first?.result == billing.charged[request.requestID]?.outcome,
                "\(request.requestID): final \(String(describing: finals.first?.result)), billing charged \(String(describing: billing.charged[request.requestID]))"
            )
            let pending = mine.filter(\.isInDoubt)
            #expect(pending.count <= 1 && pending.allSatisfy { $0.pendingReason == .outcomeUnknown })
            if let first = pending.first { #expect(mine.first == first, "\(request.requestID): the pending came last") }
        }
        #expect(billing.undeclaredRepeats == [], "called again without isRecovery")
        #expect(billing.overlaps == [], "a user's request was called while billing worked on another")
    }

    @Test(
        "across an outage: each user's first request goes in doubt (pending), the second waits; once billing answers, every request ends as billing recorded"
    )
    func outage() async throws {
        let billing = OutageBilling()
        let harness = LoopHarness(configure: Self.configure, router: router(billing))
        harness.assign(partitions: 1)
        // Offset 0: another user's request, answered before the outage (so the commit can move).
        harness.feed(request(99, user: "early"))
        #expect(await eventually(timeout: .seconds(120)) { harness.consumer.snapshot.stored.values.max() == 1 })
        billing.startOutage()
        for request in Self.requests() { harness.feed(request) }
        #expect(await eventually(timeout: .seconds(120)) { harness.statistics.inDoubtOpen == Self.users.count })
        // In doubt: one pending each, nothing granted, nothing failed; the users' next requests
        // were never called (their lanes are held); the records are not committed.
        let pending = harness.producer.outcomes().filter { $0.requestID != "req-99" }
        #expect(pending.count == Self.users.count && pending.allSatisfy { $0.result == .pending })
        #expect(Set(pending.map(\.requestID)) == Set((0..<6).map { "req-\($0)" }))
        #expect((6..<12).allSatisfy { billing.snapshot.callsByRequest["req-\($0)"] == nil })
        // The commit stops at the first in-doubt record (offset 1): a restart reads it again. A
        // record finished past them (offset 13: a request_id conflict, no billing) makes the loop
        // commit again, with it in the metadata, and the offset still at 1.
        harness.feed(request(99, user: "early", product: "rc_other"))
        #expect(
            await eventually(timeout: .seconds(180)) {
                harness.consumer.snapshot.metadata.values.contains { $0 != nil }
            })
        #expect(harness.consumer.snapshot.stored.values.max() == 1)
        billing.endOutage()
        #expect(await harness.waitForFinished(14))
        #expect(await eventually(timeout: .seconds(180)) { harness.consumer.snapshot.stored.values.max() == 14 })
        let outcomes = harness.producer.outcomes().filter { $0.requestID != "req-99" }
        Self.expectOutcomesMatchBilling(outcomes, billing.snapshot, requests: Self.requests())
        #expect(harness.producer.deadLetters().map(\.error.errorClass) == ["request_id_conflict"])
        #expect(harness.statistics.inDoubtOpened == 6 && harness.statistics.inDoubtResolved == 6)
        #expect(harness.statistics.inDoubtOpen == 0)
        await harness.stop()
    }

    @Test(
        "a restart in the outage: the in-doubt records are read again (their offsets were not committed), billing is asked again only with recovery calls, and each gets its one final outcome, no second pending"
    )
    func restartInTheOutage() async throws {
        let billing = OutageBilling(inOutage: true)
        let first = await Self.inDoubtHarness(billing)
        let requests = Self.requests()
        // The in-doubt marks must be in the changelog before the "crash".
        #expect(
            await eventually(timeout: .seconds(180)) {
                first.producer.journal().filter { $0.entry.inDoubtSinceMs != nil }.count >= Self.users.count
            })
        await first.stop()
        let committed = first.consumer.snapshot.stored.values.max() ?? 0
        #expect(committed == 0, "an in-doubt record was committed: its reconciliation would end with the process")
        let beforeRestart = billing.snapshot.calls

        let second = LoopHarness(configure: Self.configure, router: router(billing))
        // The changelog so far, then the records from the committed offset, as a new owner reads them.
        second.assign(restored: LoopHarness.restore(first.producer.produced), partitions: 1)
        for request in requests { second.feed(request) }
        #expect(await eventually(timeout: .seconds(120)) { billing.snapshot.calls > beforeRestart })
        billing.endOutage()
        #expect(await second.waitForFinished(12))
        let outcomes = first.producer.outcomes() + second.producer.outcomes()
        Self.expectOutcomesMatchBilling(outcomes, billing.snapshot, requests: requests)
        #expect(!second.producer.outcomes().contains { $0.result == .pending }, "pending published twice")
        #expect(second.statistics.recovered >= 6 && second.statistics.inDoubtResolved == 6)
        await second.stop()
    }

    @Test(
        "billing never answers within --reconcile-for: dead letter in_doubt_expired, the outcome stays pending, and the user's next request goes on"
    )
    func expires() async throws {
        let billing = OutageBilling(inOutage: true)
        let harness = LoopHarness(
            configure: {
                Self.configure(&$0)
                $0.reconciliation.duration = .milliseconds(400)
            }, router: router(billing))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        #expect(await eventually(timeout: .seconds(120)) { harness.statistics.inDoubtExpired == 1 })
        // The lane moves on while billing may still work on req-0: req-1 is called in the outage.
        #expect(await eventually(timeout: .seconds(120)) { billing.snapshot.callsByRequest["req-1"] != nil })
        billing.endOutage()
        #expect(await harness.waitForFinished(2))
        let outcomes = harness.producer.outcomes()
        #expect(outcomes.filter { $0.requestID == "req-0" }.map(\.result) == [.pending])
        #expect(outcomes.filter { $0.requestID == "req-1" }.map(\.result) == [.purchased])
        let letters = harness.producer.deadLetters()
        #expect(letters.map(\.requestID) == ["req-0"] && letters.first?.error.errorClass == "in_doubt_expired")
        // Expiry is the one time a user's lane moves on with billing's answer unknown: req-1 was
        // called while the outage still held req-0 at billing (once per attempt of req-1 made
        // before the outage ended). Exactly that, and nothing else.
        let overlaps = billing.snapshot.overlaps
        #expect(!overlaps.isEmpty && overlaps.allSatisfy { $0 == "u: req-1 while req-0" }, "\(overlaps)")
        // Journaled closed: a re-send is a duplicate, never asked again.
        let entry = harness.producer.journal().last { $0.entry.requestID == "req-0" }?.entry
        #expect(entry?.result == .pending && entry?.error?.type == "in_doubt_expired")
        await harness.stop()
    }

    @Test(
        "a revocation with requests in doubt hands the partition over at once, its commit at the first in-doubt record, and the buffer released"
    )
    func revokedInDoubt() async throws {
        let billing = OutageBilling(inOutage: true)
        let harness = await Self.inDoubtHarness(billing)
        // Every ask is waiting or hangs in the outage for at most the call timeout.
        let offsets = await harness.revoke([0])
        #expect(offsets.map(\.offset) == [0], "the hand-over's commit passed an in-doubt record")
        #expect(await eventually(timeout: .seconds(180)) { harness.admission.held == 0 })
        #expect(!harness.hasEnded, "the loop stopped as if a call were stuck")
        billing.endOutage()
        await harness.stop()
        // Nothing final was published for them here: the next owner reads them again.
        #expect(!harness.producer.outcomes().contains { !$0.isInDoubt })
    }

    @Test("an open intent found at takeover holds the user until its call could no longer run, then one recovery call")
    func takeoverHold() async throws {
        let calledAt = CallTimes()
        let controller = ClosureController { request in
            calledAt.record(request)
            return .purchased
        }
        let startedAtMs = currentTimeMs()
        let harness = LoopHarness(
            configure: {
                $0.callTimeout = .milliseconds(400)
                $0.reconciliation.clockSkewMargin = .seconds(1)
            }, router: router(controller))
        harness.assign(
            partitions: 1, finished: [:],
            restored: [
                0: [
                    EntitlementStateRecord(
                        appID: "app", appUserID: "u",
                        requests: [.init(requestID: "req-0", attempts: 1, startedAtMs: startedAtMs)])
                ]
            ])
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        #expect(await harness.waitForFinished(2))
        let calls = calledAt.calls
        #expect(calls.map(\.id) == ["req-0", "req-1"] && calls[0].isRecovery, "\(calls)")
        // The recovery call is attempt 2 and req-1's call its first, but for each intent that was
        // acknowledged past half the margin (a loaded machine): that attempt was not made, and the
        // next one waited out a next owner's hold.
        let late = harness.statistics.lateIntents
        #expect(
            late.rewritten == 0 && calls.count == 2 && (calls[0].attempt - 2) + (calls[1].attempt - 1) == late.held,
            "\(calls), late intents \(late)")
        #expect(calls[0].atMs >= startedAtMs + 1_400, "called \(calls[0].atMs - startedAtMs) ms after the intent")
        #expect(harness.producer.outcomes().map(\.result) == [.purchased, .purchased])
        await harness.stop()
    }

    @Test("a reused request_id with other content is a dead letter request_id_conflict naming the first record")
    func requestIDConflict() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        harness.feed(request(0, user: "u"))  // a re-send: a duplicate
        harness.feed(request(0, user: "u", product: "rc_pro_yearly"))  // other content
        #expect(await harness.waitForFinished(3))
        #expect(controller.snapshot.calls == 1)
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-0"])
        let letters = harness.producer.deadLetters()
        #expect(letters.count == 1 && letters.first?.error.errorClass == "request_id_conflict")
        #expect(letters.first?.originalOffset == 2 && letters.first?.error.message.contains("offset 0") == true)
        #expect(harness.statistics.requestIDConflicts == 1 && harness.statistics.duplicates == 1)
        await harness.stop()
    }
}

/// When each call was made, in order.
final class CallTimes: Sendable {
    private let state = Mutex<[(id: String, attempt: Int, isRecovery: Bool, atMs: Int64)]>([])

    func record(_ request: PurchaseRequest) {
        state.withLock { $0.append((request.requestId, request.attempt, request.isRecovery, currentTimeMs())) }
    }

    var calls: [(id: String, attempt: Int, isRecovery: Bool, atMs: Int64)] { state.withLock { $0 } }
}
