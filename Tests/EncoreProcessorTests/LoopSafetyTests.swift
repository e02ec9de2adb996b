import EncoreEvents
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

@testable import EncoreProcessor

/// The engine's promise within one process, through the production intake path: no purchase
/// called twice or twice at once for a user, none handed over while running, outputs in order,
/// no commit past an output that cannot be delivered.
@Suite("Loop safety: rebalance, timeouts, redelivery, fatal outputs (no Kafka)", .timeLimit(.minutes(5)))
struct LoopSafetyTests {
    /// Whether a hand-over happened, with its offsets.
    final class HandOverProbe: Sendable {
        private let state = Mutex<[KafkaTopicPartitionOffset]?>(nil)
        var offsets: [KafkaTopicPartitionOffset]? { state.withLock { $0 } }

        func revoke(_ harness: LoopHarness, partitions: [Int32]) {
            harness.inbox.post(
                .revoked(
                    partitions.map { KafkaTopicPartition(topic: LoopHarness.topic, partition: $0) },
                    { offsets, _ in self.state.withLock { $0 = offsets } }))
        }
    }

    /// A harness whose controller holds req-0 until its gate opens, ignoring cancellation (a
    /// controller that goes on regardless); partition 0 assigned.
    func harnessWithStuckCall(
        configure: @escaping (inout ProcessorConfiguration) -> Void = {
            $0.drainTimeout = .milliseconds(100)
            $0.callTimeout = .seconds(60)
        }
    ) -> (Gate, RecordingController, LoopHarness) {
        let gate = Gate { $0.requestId == "req-0" }
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(configure: configure, router: router(controller))
        harness.assign(partitions: 1)
        return (gate, controller, harness)
    }

    @Test(
        "a revocation past its drain timeout cancels the running call and waits until it returned; never hands over before"
    )
    func revocationWaitsForTheCall() async throws {
        let (gate, controller, harness) = harnessWithStuckCall()
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "v"))
        #expect(await eventually { gate.waiting == 1 && harness.statistics.finished == 1 })
        let probe = HandOverProbe()
        probe.revoke(harness, partitions: [0])
        // Past the deadline the call is cancelled; it ignores that and goes on: no hand-over.
        #expect(await eventually { controller.snapshot.cancelled == 1 })
        #expect(probe.offsets == nil, "handed over with a call running")
        gate.open()
        let offsets = try #require(await eventually { probe.offsets != nil } ? probe.offsets : nil)
        // The late call's answer was published and its offset is in the hand-over's commit.
        #expect(offsets.map(\.offset) == [2])
        #expect(harness.producer.outcomes().map(\.requestID).sorted() == ["req-0", "req-1"])
        // The same member gets the partition back and is handed req-0 again (its commit did not land):
        // it is answered already, so it is neither called nor answered twice.
        // (Assigned as the forwarder does: the users' journals restored from the changelog written so far.)
        harness.assignRestoringChangelog(partitions: 1)
        harness.feed(
            KafkaMessage(
                topic: LoopHarness.topic, partition: 0, offset: 0, key: nil, value: request(0, user: "u").jsonBytes()))
        #expect(await eventually { harness.statistics.duplicates == 1 })
        #expect(controller.snapshot.repeated == [] && controller.snapshot.overlaps == [])
        #expect(harness.producer.outcomes().count == 2)
        await harness.stop()
    }

    @Test("a timed-out call that ignores cancellation keeps its user's lane: the next request waits until it returns")
    func timeoutHoldsTheLane() async throws {
        let gate = Gate { $0.requestId == "req-0" }
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(configure: { $0.callTimeout = .milliseconds(50) }, router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        harness.feed(request(2, user: "v"))
        #expect(await eventually { controller.snapshot.cancelled == 1 && harness.statistics.finished == 1 })
        // Other users go on; u's next request is not called while req-0 is alive.
        #expect(controller.snapshot.callsByUser["u"] == ["req-0"])
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-2"])
        gate.open()
        #expect(await harness.waitForFinished(3))
        #expect(controller.snapshot.callsByUser["u"] == ["req-0", "req-1"])
        #expect(controller.snapshot.overlaps == [])
        // It answered after all: that answer is what billing did, so it is the outcome.
        let outcomes = harness.producer.outcomes().filter { $0.appUserID == "u" }
        #expect(outcomes.map(\.requestID) == ["req-0", "req-1"])
        #expect(outcomes.map(\.result) == [.purchased, .purchased])
        await harness.stop()
    }

    /// Calls time out after 50 ms; three attempts, retried at once; in doubt, asked again every
    /// 100 ms at most; partition 0 assigned. The harness's wide clock-skew margin is kept: no
    /// intent is acknowledged too late to launch within a test's deadlines, so every attempt
    /// makes its call and only the first is not a recovery.
    func timeoutHarness(_ controller: RecordingController) -> LoopHarness {
        let harness = LoopHarness(
            configure: {
                $0.callTimeout = .milliseconds(50)
                $0.retry = RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(1))
                $0.reconciliation.maxInterval = .milliseconds(100)
                $0.reconciliation.initialInterval = .milliseconds(20)
            }, router: router(controller))
        harness.assign(partitions: 1)
        return harness
    }

    @Test(
        "a timed-out call that honours cancellation is tried again as a recovery call, once it returned; with no attempts left it is in doubt (pending) and reconciled, never failed"
    )
    func timeoutRecovers() async throws {
        // req-0's calls hang until billing is told to answer.
        let answering = EndedFlag()
        let controller = RecordingController(
            latency: { $0.requestId == "req-0" && !answering.isSet ? .seconds(600) : .zero })
        let harness = timeoutHarness(controller)
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        #expect(await eventually { harness.producer.outcomes().count == 1 })
        let pending = try #require(harness.producer.outcomes().first)
        #expect(pending.requestID == "req-0" && pending.result == .pending && pending.pendingReason == .outcomeUnknown)
        #expect(pending.attempts == 3 && harness.producer.deadLetters().isEmpty)
        #expect(controller.snapshot.callsByRequest["req-1"] == nil, "req-1 ran while req-0 was in doubt")
        answering.set()
        #expect(await harness.waitForFinished(2))
        // (req-1 in doubt first, below, is purchased on a later reconciliation.)
        #expect(
            await eventually {
                harness.producer.outcomes().last.map { $0.requestID == "req-1" && $0.result == .purchased } == true
            })
        let outcomes = harness.producer.outcomes()
        let calls = controller.snapshot
        // req-1 answers at once, but its call too is timed out when this loaded machine holds the
        // loop past the 50 ms between the call's start and the batch's end: then it is called again
        // as a declared recovery (after three such, in doubt first). Counted, never assumed away.
        #expect(outcomes.prefix(2).map(\.requestID) == ["req-0", "req-0"])
        #expect(outcomes.prefix(2).map(\.result) == [.pending, .purchased])
        let req1 = Array(outcomes.dropFirst(2))
        #expect(req1.allSatisfy { $0.requestID == "req-1" })
        #expect(
            req1.map(\.result) == [.purchased]
                || (req1.map(\.result) == [.pending, .purchased] && req1[0].attempts == 3),
            "req-1 purchased, in doubt first only once all three of its attempts were timed out")
        // Every call of a request after its first declared as a recovery; never two at once.
        #expect(calls.callsByRequest["req-0"] == calls.recoveriesByRequest["req-0", default: 0] + 1)
        let req1Repeats = calls.recoveriesByRequest["req-1", default: 0]
        #expect(calls.callsByRequest["req-1"] == req1Repeats + 1, "req-1's repeats: \(req1Repeats) declared")
        #expect(calls.undeclaredRepeats == [] && calls.overlaps == [])
        #expect(harness.statistics.lateIntents == LateIntents(), "no attempt was held: each one called")
        await harness.stop()
    }

    @Test("a call that timed out and then answers on its recovery call gets that answer as its outcome")
    func timeoutThenRecoveryAnswers() async throws {
        let controller = RecordingController(
            latency: { $0.requestId == "req-0" && !$0.isRecovery ? .seconds(600) : .zero })
        let harness = timeoutHarness(controller)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(await eventually { harness.producer.outcomes().last?.result == .purchased })
        let outcomes = harness.producer.outcomes()
        // One recovery call, or more when this loaded machine held the loop past a recovery call's
        // 50 ms (each then timed out and called again, declared). Every attempt made its call (no
        // intent was held: the harness's margin), so the outcome's attempts are the calls; once
        // all three were used, in doubt first (attempts 3) and purchased on reconciliation.
        let calls = controller.snapshot
        let made = calls.callsByRequest["req-0", default: 0]
        #expect(made == 1 + calls.recoveriesByRequest["req-0", default: 0] && made >= 2)
        #expect(harness.statistics.lateIntents == LateIntents(), "no attempt was held: each one called")
        #expect(
            outcomes.map { [$0.result: $0.attempts] } == [[.purchased: made]]
                || outcomes.map { [$0.result: $0.attempts] } == [[.pending: 3], [.purchased: made]],
            "outcomes \(outcomes.map { ($0.result, $0.attempts) }), \(made) calls")
        #expect(controller.snapshot.undeclaredRepeats == [])
        #expect(harness.producer.deadLetters().isEmpty)
        await harness.stop()
    }

    @Test("a user's outputs keep their order when a delivery fails and is produced again")
    func redeliveryOrder() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        // The first output (req-0's outcome) times out in librdkafka.
        harness.producer.failNext([KafkaError(code: .messageTimedOut, message: "broker away", isRetriable: true)])
        harness.assign(partitions: 1)
        for index in 0..<3 {
            // Each grants a trial of its own product: every request publishes change events too.
            var event = request(index, user: "u", product: "trial_\(index)")
            event.entitlement = Entitlement(type: .freeTrial, value: 7, unit: .days)
            harness.feed(event)
        }
        #expect(await harness.waitForFinished(3))
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-0", "req-1", "req-2"])
        let changes = harness.producer.produced.filter { $0.topic == "encore.entitlement-changes" }.map {
            try! EntitlementChangeEvent(jsonBytes: $0.value).sequence
        }
        #expect(!changes.isEmpty && changes == changes.sorted())
        // It was produced again: one more hand-over to the producer than records acknowledged.
        #expect(harness.producer.handedOver.count == harness.producer.produced.count + 1)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 3 })
        await harness.stop()
    }

    @Test(
        "outputs librdkafka refuses to enqueue (a full local queue) are produced again, whole and in order; the next outputs are unharmed"
    )
    func refusedProduce() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        // The first two outputs handed to the producer (req-0's intent, then req-1's) are refused.
        harness.producer.refuseNext(
            2, with: KafkaError(code: .queueFull, message: "local queue full", isRetriable: true))
        harness.assign(partitions: 1)
        let events = (0..<4).map { request($0, user: $0 % 2 == 0 ? "u" : "v") }
        for event in events { harness.feed(event) }
        #expect(await harness.waitForFinished(4))
        #expect(controller.snapshot.overlaps == [])
        // Every output arrived as its contract record: the refused ones rebuilt from the buffer,
        // the ones after them in a buffer the refused records did not disturb.
        let outcomes = harness.producer.outcomes()
        #expect(outcomes.filter { $0.appUserID == "u" }.map(\.requestID) == ["req-0", "req-2"])
        #expect(outcomes.filter { $0.appUserID == "v" }.map(\.requestID) == ["req-1", "req-3"])
        for record in harness.producer.produced where record.topic == "encore.purchase-outcomes" {
            let outcome = try PurchaseOutcomeEvent(jsonBytes: record.value)
            #expect(record.key == Array(outcome.key.utf8))
            #expect(record.headers.first { $0.key == "ce_id" }?.stringValue == "outcome:\(outcome.requestID)")
        }
        let journal = harness.producer.journal()
        #expect(Set(journal.map(\.entry.requestID)) == Set(events.map(\.requestID)))
        #expect(journal.filter { $0.entry.result == nil }.count == 4, "one intent each, produced once")
        // The refused two never reached the producer's queue: handed over as many times as acknowledged.
        #expect(harness.producer.handedOver.count == harness.producer.produced.count)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 4 })
        await harness.stop()
    }

    @Test("shutdown never ends with a call alive: past the drain deadline it cancels and waits for the call")
    func shutdownWaitsForTheCall() async throws {
        let (gate, controller, harness) = harnessWithStuckCall()
        harness.feed(request(0, user: "u"))
        #expect(await eventually { gate.waiting == 1 })
        harness.inbox.post(.shutdown)
        #expect(await eventually { controller.snapshot.cancelled == 1 })
        #expect(!harness.hasEnded, "the loop ended with a call running")
        gate.open()
        #expect(await harness.ended() == nil)
        // Produced before the loop ended; acknowledged after.
        #expect(await eventually { harness.producer.outcomes().map(\.requestID) == ["req-0"] })
    }

    @Test("a call that ignores cancellation for as long as the group allows stops the loop without a hand-over")
    func stuckCallStops() async throws {
        let (gate, _, harness) = harnessWithStuckCall {
            $0.callTimeout = .milliseconds(50)
            $0.drainTimeout = .milliseconds(100)
            // The hand-over limit: what max.poll.interval.ms leaves after the drain (1 s at least).
            $0.kafka["max.poll.interval.ms"] = "200"
        }
        harness.feed(request(0, user: "u"))
        #expect(await eventually { gate.waiting == 1 })
        let probe = HandOverProbe()
        probe.revoke(harness, partitions: [0])
        let failure = await harness.ended()
        #expect(failure?.code == .callStuck)
        #expect(probe.offsets == nil, "handed over with a call alive")
        #expect(harness.producer.outcomes().isEmpty)
        gate.open()
    }

    @Test(
        "an output to a missing topic stops the loop with a clear error: no retry loop, no commit past the record",
        arguments: [KafkaError.Code.unknownTopicOrPartition, KafkaError.Code(rawValue: 10)])
    func fatalOutput(code: KafkaError.Code) async throws {
        let controller = RecordingController()
        let harness = LoopHarness(configure: { $0.ledgerEnabled = false }, router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 1 })
        // req-1's first output is its intent: it fails, so req-1 is never called.
        harness.producer.failNext([KafkaError(code: code, message: "gone", isRetriable: true)])
        harness.feed(request(1, user: "v"))
        let failure = await harness.ended()
        #expect(failure?.code == .outputLost)
        #expect(failure?.message.contains("encore.entitlement-state") == true)
        // req-0's intent, outcome and result; req-1's intent, once.
        #expect(harness.producer.handedOver.count == 4, "the failed output was produced again")
        #expect(controller.snapshot.calls == 1, "called without a durable intent")
        #expect(harness.consumer.snapshot.stored.values.max() == 1)
    }
}
