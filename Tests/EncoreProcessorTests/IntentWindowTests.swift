import EncoreEvents
import Kafka
import Testing

@testable import EncoreProcessor

/// The intents journaled ahead of the calls (`Worker.intentWindow`) under what frees or takes slots
/// out of the usual order: a revocation, an ask of a request in doubt.
@Suite("Worker: the intents ahead of the calls")
struct IntentWindowTests {
    typealias W = WorkerTests

    static func rec(_ index: Int, user: String, partition: Int32, offset: Int64) -> IncomingRecord {
        let event = request(index, user: user)
        return IncomingRecord(
            message: KafkaMessage(
                topic: W.topic, partition: partition, offset: offset, key: Array(event.key.utf8),
                value: event.jsonBytes(), headers: []))
    }

    static func intents(_ actions: [WorkerAction]) -> [(partition: Int32, id: String)] {
        actions.flatMap { action -> [(partition: Int32, id: String)] in
            guard case .produce(let outputs) = action else { return [] }
            return outputs.compactMap { output in
                if case .journal(let entry, let partition) = output.output, entry.entry.result == nil {
                    (partition, entry.entry.requestID)
                } else {
                    nil
                }
            }
        }
    }

    @Test("a revocation that frees a slot publishes no intent of a leaving partition")
    func revokePublishesLeavingIntent() throws {
        var driven = W.Driven {
            $0.maxInFlight = 1
            $0.callTimeout = .seconds(2)
            $0.retry = RetryPolicy(maxAttempts: 5, initialBackoff: .seconds(10), maxBackoff: .seconds(10))
        }
        _ = driven.step(
            .assigned(
                [KafkaTopicPartition(topic: W.topic, partition: 0), KafkaTopicPartition(topic: W.topic, partition: 1)],
                finished: [:], restored: [:], committed: [:]))
        // A on partition 1: intent, call.
        let a = driven.step(.records([Self.rec(0, user: "a", partition: 1, offset: 0)]))
        let aCall = try #require(W.calls(driven.step(W.acknowledged(W.produced(a)))).first)
        // Users B on partition 0 fill the window; C on partition 1 waits for a place.
        let window = driven.worker.intentWindow
        let b = driven.step(
            .records(
                (1...window).map { Self.rec($0, user: "b\($0)", partition: 0, offset: Int64($0 - 1)) }
                    + [Self.rec(window + 1, user: "c", partition: 1, offset: 1)]))
        #expect(Self.intents(b).count == window)
        // B's intents durable: they wait for the one slot.
        _ = driven.step(W.acknowledged(W.produced(b)))
        #expect(driven.worker.waitingForSlot.count == window && driven.worker.waitingForIntent.count == 1)
        // A fails retriably: it backs off 5-10 s holding its slot.
        _ = driven.step(
            .attemptFinished(
                call: aCall.id, attempt: 1, .failure(PurchaseControllerError.retryable("http_503", "down"))))
        // Partition 1 is revoked.
        let revoked = driven.step(
            .revoked([KafkaTopicPartition(topic: W.topic, partition: 1)], { _, _ in }))
        let published = Self.intents(revoked)
        #expect(!published.contains { $0.partition == 1 }, "an intent of the leaving partition: \(published)")
        #expect(driven.worker.waitingForIntent.isEmpty)
    }

    /// Acknowledges every produce of `actions` (and what follows) until nothing is produced; returns
    /// all actions.
    static func settleOutputs(_ driven: inout W.Driven, _ actions: [WorkerAction]) -> [WorkerAction] {
        var all: [WorkerAction] = []
        var pending = actions.flatMap { action -> [(token: UInt, output: UnsentOutput)] in
            if case .produce(let outputs) = action { outputs } else { [] }
        }
        for _ in 0..<10 where !pending.isEmpty {
            let next = driven.step(W.acknowledged(pending))
            all += next
            pending = next.flatMap { action -> [(token: UInt, output: UnsentOutput)] in
                if case .produce(let outputs) = action { outputs } else { [] }
            }
        }
        return all
    }

    @Test("an ask of a request in doubt that returns unanswered gives its slot to the calls waiting for one")
    func inDoubtAskStrandsWindow() throws {
        var driven = W.Driven {
            $0.maxInFlight = 1
            $0.retry = RetryPolicy(maxAttempts: 1, initialBackoff: .milliseconds(10), maxBackoff: .milliseconds(10))
        }
        _ = driven.step(W.assignment())
        let unknown = PurchaseControllerError.outcomeUnknown("http_502", "gateway")
        // X: intent, call, outcome unknown with no attempts left: in doubt (no slot).
        let x = driven.step(.records([Self.rec(0, user: "x", partition: 0, offset: 0)]))
        let xCall = try #require(W.calls(driven.step(W.acknowledged(W.produced(x)))).first)
        let doubted = driven.step(.attemptFinished(call: xCall.id, attempt: 1, .failure(unknown)))
        _ = Self.settleOutputs(&driven, doubted)
        // The first ask is due: journaled, then launched (it takes the slot).
        let ask = driven.step(.tick, after: .seconds(2))
        let asked = Self.settleOutputs(&driven, ask)
        let askCall = try #require(W.calls(asked).first, "no ask: \(ask) \(asked)")
        // Users Y fill the window and wait for the slot; one more waits for a place.
        let window = driven.worker.intentWindow
        let ys = driven.step(
            .records((1...window + 1).map { Self.rec($0, user: "y\($0)", partition: 0, offset: Int64($0)) }))
        _ = driven.step(W.acknowledged(W.produced(ys)))
        #expect(driven.worker.waitingForSlot.count == window && driven.worker.waitingForIntent.count == 1)
        // The ask returns with no answer: X waits for its next ask, without a slot.
        let returned = driven.step(.attemptFinished(call: askCall.id, attempt: askCall.attempt, .failure(unknown)))
        // The slot is free: the first waiting call starts at once, and Y4's intent takes its place ahead.
        #expect(W.calls(returned).map(\.request.requestId) == ["req-1"], "\(returned)")
        #expect(Self.intents(returned).map(\.id) == ["req-\(window + 1)"])
        #expect(!driven.worker.calls.hasFreeSlot && driven.worker.waitingForIntent.isEmpty)
    }
}
