import EncoreEvents
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

@testable import EncoreProcessor

/// Exactly-once mode through the loop, with a committer that holds each commit until released.
@Suite("Exactly-once loop: calls after the intent's transaction, offsets in the transaction (no Kafka)")
struct TransactionLoopTests {
    /// Records each commit's offsets and what was produced by then; holds commits while `held`.
    final class HeldCommitter: TransactionCommitter {
        struct State {
            var held = true
            var commits: [[KafkaTopicPartitionOffset]] = []
            /// The topics handed to the producer when each commit happened.
            var producedAtCommit: [[String]] = []
        }
        let state = Mutex(State())
        let producer: FakeProducer

        init(producer: FakeProducer) { self.producer = producer }

        func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
            while state.withLock({ $0.held }) { try? await Task.sleep(for: .milliseconds(2)) }
            let produced = producer.handedOver.map(\.topic)
            state.withLock {
                $0.commits.append(offsets)
                $0.producedAtCommit.append(produced)
            }
        }

        func abort() async throws(KafkaError) {}

        func release() { state.withLock { $0.held = false } }
        var snapshot: State { state.withLock { $0 } }
    }

    /// A loop whose commits are held, fed one request of user `u`: returned once the request's
    /// intent is produced and acknowledged (its transaction not committed).
    static func heldRequest(_ controller: RecordingController) async throws -> (LoopHarness, HeldCommitter) {
        let made = Mutex<HeldCommitter?>(nil)
        let harness = LoopHarness(router: router(controller)) { producer in
            let committer = HeldCommitter(producer: producer)
            made.withLock { $0 = committer }
            return committer
        }
        let held = try #require(made.withLock { $0 })
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(
            await eventually {
                harness.producer.produced.contains { $0.topic == "encore.entitlement-state" }
            })
        return (harness, held)
    }

    @Test("a call starts only once the transaction holding its intent committed; its offset commits in a later one")
    func callAfterCommit() async throws {
        let controller = RecordingController()
        let (harness, held) = try await Self.heldRequest(controller)
        // The intent is produced and acknowledged, but its transaction is not committed: no call.
        try await Task.sleep(for: .milliseconds(200))
        #expect(controller.snapshot.calls == 0, "called before the intent's transaction committed")
        #expect(harness.consumer.snapshot.stored.isEmpty)
        held.release()
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 1)
        // The first transaction held the intent alone; the outcome went into a later one.
        #expect(held.snapshot.producedAtCommit.first == ["encore.entitlement-state"])
        // The offset past the record commits with the transaction holding its outcome, never through the consumer.
        #expect(await eventually { held.snapshot.commits.contains { $0.map(\.offset) == [1] } })
        #expect(harness.consumer.snapshot.stored.isEmpty)
        await harness.stop()
    }

    @Test("a request's stages: its intent's span lasts until the transaction holding the intent committed")
    func stagesCountTheIntentsCommit() async throws {
        let (harness, held) = try await Self.heldRequest(RecordingController())
        // The intent is acknowledged, its transaction held for at least 200 ms more.
        try await Task.sleep(for: .milliseconds(200))
        held.release()
        #expect(await harness.waitForFinished(1))
        await harness.stop()
        let stages = harness.statistics.stages
        #expect(stages.count == 1, "an exactly-once request passes every stage too")
        #expect(stages.intent >= .milliseconds(200), "the intent's span ends at its commit: \(stages.intent)")
    }
}

/// Failure, hand-over and shutdown in exactly-once mode.
@Suite("Exactly-once loop: failed commits, hand-over, shutdown (no Kafka)", .timeLimit(.minutes(5)))
struct TransactionEndingTests {
    final class FailingCommitter: TransactionCommitter {
        let attempts = Mutex(0)
        let aborts = Mutex(0)
        let error: KafkaError
        init(_ error: KafkaError = KafkaError(code: .invalidConfiguration, message: "the transaction must be aborted"))
        {
            self.error = error
        }
        func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
            attempts.withLock { $0 += 1 }
            throw error
        }
        func abort() async throws(KafkaError) { aborts.withLock { $0 += 1 } }
    }

    final class RecordingCommitter: TransactionCommitter {
        let commits = Mutex<[[KafkaTopicPartitionOffset]]>([])
        let aborts = Mutex(0)
        func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
            try? await Task.sleep(for: .milliseconds(10))
            commits.withLock { $0.append(offsets) }
        }
        func abort() async throws(KafkaError) { aborts.withLock { $0 += 1 } }
    }

    /// Holds each commit until released, then commits or refuses it; counts aborts.
    final class GatedCommitter: TransactionCommitter {
        let refuses: Bool
        let released = Mutex(false)
        let started = Mutex(0)
        let aborts = Mutex(0)
        init(refuses: Bool) { self.refuses = refuses }
        func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
            started.withLock { $0 += 1 }
            while !released.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(2)) }
            if refuses { throw KafkaError(code: .invalidConfiguration, message: "the transaction must be aborted") }
        }
        func abort() async throws(KafkaError) { aborts.withLock { $0 += 1 } }
    }

    /// The loop ends (the consumer failed) while its intent's transaction commits; the commit's
    /// end reaches an inbox no one reads any more, so the ending worker awaits it to decide.
    @Test(
        "a commit still in flight when the loop ends decides: committed, nothing to abort; refused, aborted",
        arguments: [false, true])
    func commitInFlightAtEnd(refused: Bool) async throws {
        let controller = RecordingController()
        let committer = GatedCommitter(refuses: refused)
        let harness = LoopHarness(router: router(controller)) { _ in committer }
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await eventually { committer.started.withLock { $0 } == 1 })
        harness.inbox.post(.consumerFailed(KafkaError(code: .invalidConfiguration, message: "gone")))
        #expect(await eventually { harness.hasStoppedHandling })
        #expect(!harness.hasEnded, "ended before the commit in flight returned")
        committer.released.withLock { $0 = true }
        let failure = await harness.ended()
        #expect(failure?.code == .kafka)
        #expect(committer.aborts.withLock { $0 } == (refused ? 1 : 0))
        #expect(harness.statistics.abortedTransactions == (refused ? 1 : 0))
        #expect(controller.snapshot.calls == 0, "called after the loop ended")
    }

    /// A transaction committed earlier must not be taken for the one left open: the worker that
    /// fails later still aborts what it holds (the call's outcome, produced after the commit).
    @Test("a worker that fails after a committed transaction aborts the one it left open")
    func abortAfterEarlierCommit() async throws {
        let controller = RecordingController(latency: { _ in .milliseconds(300) })
        let committer = RecordingCommitter()
        let harness = LoopHarness(router: router(controller)) { _ in committer }
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        // The call starts once the transaction holding its intent committed.
        #expect(await eventually { controller.snapshot.calls == 1 })
        #expect(committer.commits.withLock { $0.count } >= 1)
        harness.inbox.post(.consumerFailed(KafkaError(code: .invalidConfiguration, message: "gone")))
        let failure = await harness.ended()
        #expect(failure?.code == .kafka)
        #expect(committer.aborts.withLock { $0 } == 1, "the open transaction was left to transaction.timeout.ms")
        #expect(harness.statistics.abortedTransactions == 1)
    }

    @Test("a failed commit stops the loop once: no call, no second commit")
    func failedCommitStops() async throws {
        let controller = RecordingController()
        let committer = FailingCommitter()
        let harness = LoopHarness(router: router(controller)) { _ in committer }
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        let failure = await harness.ended()
        #expect(failure?.code == .outputLost)
        #expect(committer.attempts.withLock { $0 } == 1, "committed again after a failed transaction")
        #expect(controller.snapshot.calls == 0, "called though the intent's transaction failed")
        // The failed commit left the intent's transaction open: aborted once, when the loop ended.
        #expect(committer.aborts.withLock { $0 } == 1)
        #expect(harness.statistics.abortedTransactions == 1)
    }

    /// Commits the first `succeeding` transactions, refuses the others.
    final class FailingLaterCommitter: TransactionCommitter {
        let succeeding: Int
        let commits = Mutex(0)
        init(succeeding: Int) { self.succeeding = succeeding }
        func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
            let number = commits.withLock {
                $0 += 1
                return $0
            }
            if number > succeeding {
                throw KafkaError(code: .invalidConfiguration, message: "the transaction must be aborted")
            }
        }
        func abort() async throws(KafkaError) {}
    }

    @Test(
        "a retry whose intent's transaction fails leaves the call table once: the loop stops cleanly, the retry never called"
    )
    func retryIntentLost() async throws {
        let controller = RecordingController(answer: { request in
            if request.attempt == 1 { throw PurchaseControllerError.retryable("busy", "try later") }
            return .purchased
        })
        let committer = FailingLaterCommitter(succeeding: 1)
        let harness = LoopHarness(router: router(controller)) { _ in committer }
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        let failure = await harness.ended()
        #expect(failure?.code == .outputLost)
        #expect(controller.snapshot.calls == 1, "the retry was called though its intent's transaction failed")
        #expect(harness.producer.outcomes().isEmpty)
    }

    @Test(
        "fenced (another producer took the transactional.id): the loop stops with an error naming --instance-id, never retrying into a fencing loop"
    )
    func fencedStops() async throws {
        let controller = RecordingController()
        let committer = FailingCommitter(
            KafkaError(code: .producerFenced, message: "there is a newer producer with the same transactionalId"))
        let harness = LoopHarness(configure: { $0.instanceID = "pod-3" }, router: router(controller)) { _ in committer }
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        let failure = await harness.ended()
        #expect(failure?.code == .fenced)
        #expect(failure?.message.contains("--instance-id pod-3") == true, "\(String(describing: failure))")
        #expect(committer.attempts.withLock { $0 } == 1 && controller.snapshot.calls == 0)
    }

    /// A worker whose partitions have no record read yet still fences a zombie: its transactions
    /// (here, an expiry's outputs) carry the offsets its partitions were assigned with, so the
    /// broker checks the group generation with them.
    @Test("a transaction of a partition with nothing read carries the offset it was assigned with")
    func fencedWithoutRecords() async throws {
        let committer = RecordingCommitter()
        var catalog = EntitlementCatalog()
        catalog.add(try AccessRule.parse("pro = encore:freeTrial"))
        let harness = LoopHarness(configure: { $0.catalog = catalog }, router: router(RecordingController())) { _ in
            committer
        }
        let past = currentTimeMs() - 60_000
        let grant = EntitlementStateRecord.Grant(
            productID: "trial_week", entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days),
            status: .verified, isActive: true, grantedAtMs: past - 1000, expiresAtMs: past, requestID: "r")
        let assignedWith = KafkaTopicPartitionOffset(
            topic: LoopHarness.topic, partition: 0, offset: 42,
            metadata: FinishedOffsets.encode(committed: 42, finished: [44]))
        harness.assign(
            partitions: 1, finished: [:],
            restored: [0: [EntitlementStateRecord(appID: "app", appUserID: "u9", sequence: 2, grants: [grant])]],
            committed: [0: assignedWith])
        // The expiry's change events and changelog record commit in a transaction with the offset.
        #expect(await eventually { committer.commits.withLock { !$0.isEmpty } })
        #expect(harness.producer.produced.contains { $0.topic == "encore.entitlement-changes" })
        #expect(committer.commits.withLock { $0.first } == [assignedWith])
        await harness.stop()
    }

    @Test("a revocation and the shutdown complete; offsets go only into transactions, every owned partition's")
    func revokeAndShutdown() async throws {
        let controller = RecordingController(latency: { _ in .milliseconds(20) })
        let committer = RecordingCommitter()
        let harness = LoopHarness(router: router(controller)) { _ in committer }
        harness.assign(partitions: 2)
        for index in 0..<20 { harness.feed(request(index, user: "u\(index % 5)"), partition: Int32(index % 2)) }
        #expect(await eventually { controller.snapshot.calls >= 2 })
        let handedOver = await harness.revoke([0])
        #expect(handedOver.isEmpty, "the consumer commits nothing in exactly-once mode")
        await harness.stop()
        #expect(harness.hasEnded && harness.consumer.snapshot.stored.isEmpty)
        let commits = committer.commits.withLock { $0 }
        // Partition 1 stayed: its offset is in the last transaction; partition 0's left with its hand-over.
        #expect(commits.last.map { $0.map(\.partition) } == [1])
        #expect((commits.last?.first?.offset ?? 0) >= 1)
        #expect(controller.snapshot.undeclaredRepeats == [] && controller.snapshot.overlaps == [])
        // The last transaction committed and closed the loop's transactions: nothing to abort.
        #expect(committer.aborts.withLock { $0 } == 0)
        #expect(harness.statistics.abortedTransactions == 0)
    }
}

@Suite("Exactly-once: a stable transactional.id from the instance id")
struct TransactionalIDTests {
    @Test("the instance id (the host name by default) names the transactional.id; -X wins; 'random' is new each start")
    func derived() {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        #expect(configuration.instanceID == ProcessInfo.processInfo.hostName && !configuration.instanceID.isEmpty)
        configuration.groupID = "g"
        configuration.instanceID = "encore-1"
        #expect(configuration.transactionalIDBase == "g-encore-1")
        #expect(configuration.transactionalIDBase == configuration.transactionalIDBase, "stable across starts")
        configuration.instanceID = ProcessorConfiguration.randomInstanceID
        #expect(configuration.transactionalIDBase != configuration.transactionalIDBase)
        configuration.kafka["transactional.id"] = "explicit"
        #expect(configuration.transactionalIDBase == "explicit")
    }

    @Test("an instance id that is not a name is refused at start, naming the flag")
    func validated() {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        configuration.instanceID = "pod 3/x"
        #expect(throws: ProcessorError.self) { try configuration.validate() }
        do {
            try configuration.validate()
        } catch {
            #expect(error.message.hasPrefix("instance-id:"), "\(error.message)")
        }
    }
}
