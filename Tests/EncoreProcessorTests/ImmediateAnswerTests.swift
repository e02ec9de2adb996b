import EncoreEvents
import Synchronization
import TestSupport
import Testing

@testable import EncoreProcessor

/// Answers without suspending where `answer` gives one, else through `purchase(_:)`; records both.
final class ImmediateController: PurchaseController {
    struct Call: Equatable {
        var requestID: String
        var attempt: Int
        var isRecovery: Bool
        var immediate: Bool
    }

    private let calls = Mutex<[Call]>([])
    private let answer: @Sendable (PurchaseRequest) -> Result<PurchaseResult, any Error>?

    init(answer: @escaping @Sendable (PurchaseRequest) -> Result<PurchaseResult, any Error>?) {
        self.answer = answer
    }

    var recorded: [Call] { calls.withLock { $0 } }

    func immediateAnswer(to request: PurchaseRequest) -> Result<PurchaseResult, any Error>? {
        guard let answer = answer(request) else { return nil }
        record(request, immediate: true)
        return answer
    }

    func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        record(request, immediate: false)
        return .purchased
    }

    private func record(_ request: PurchaseRequest, immediate: Bool) {
        calls.withLock {
            $0.append(
                Call(
                    requestID: request.requestId, attempt: request.attempt, isRecovery: request.isRecovery,
                    immediate: immediate))
        }
    }
}

@Suite("Controllers that answer without suspending (no Kafka)")
struct ImmediateAnswerTests {
    @Test("an immediate answer is the call: purchase(_:) is not called, and each user's requests keep their order")
    func immediateAnswersAreCalls() async throws {
        // Every third request goes through purchase(_:), so both paths interleave.
        let controller = ImmediateController { request in
            Int(request.requestId.dropFirst(4))! % 3 == 0 ? nil : .success(.cancelled)
        }
        let harness = LoopHarness(configure: { $0.maxInFlight = 8 }, router: router(controller))
        harness.assign(partitions: 1)
        var expected: [String: [String]] = [:]
        for index in 0..<600 {
            let event = request(index, user: "user-\(index % 20)")
            expected[event.appUserID, default: []].append(event.requestID)
            harness.feed(event)
        }
        #expect(await harness.waitForFinished(600))
        let calls = controller.recorded
        #expect(calls.count == 600, "one call per request, either way")
        #expect(Set(calls.map(\.requestID)).count == 600)
        #expect(calls.filter { !$0.immediate }.count == 200)
        var outcomesByUser: [String: [String]] = [:]
        for outcome in harness.producer.outcomes() {
            outcomesByUser[outcome.appUserID, default: []].append(outcome.requestID)
            let viaPurchase = Int(outcome.requestID.dropFirst(4))! % 3 == 0
            #expect(outcome.result == (viaPurchase ? .purchased : .cancelled), "\(outcome.requestID)")
        }
        #expect(outcomesByUser == expected)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 600 })
        await harness.stop()
    }

    @Test("an immediate retryable failure is tried again as a recovery call")
    func immediateFailureIsRetried() async throws {
        let controller = ImmediateController { request in
            request.attempt == 1
                ? .failure(PurchaseControllerError.retryable("store_unavailable", "try again")) : .success(.purchased)
        }
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(
            controller.recorded == [
                .init(requestID: "req-0", attempt: 1, isRecovery: false, immediate: true),
                .init(requestID: "req-0", attempt: 2, isRecovery: true, immediate: true),
            ])
        let outcomes = harness.producer.outcomes()
        #expect(outcomes.map(\.result) == [.purchased] && outcomes.map(\.attempts) == [2])
        await harness.stop()
    }
}
