import EncoreEvents
import EncoreProcessor
import Testing

@Suite("Simulated controller")
struct SimulatedControllerTests {
    static func request(_ environment: PurchaseEnvironment) -> PurchaseRequest {
        PurchaseRequest(
            event: PurchaseRequestEvent(
                requestID: "r-1", appID: "app", appUserID: "u", productID: "p", store: .appStore,
                environment: environment, requestedAtMs: 1))
    }

    @Test("it refuses PRODUCTION requests with a final error of its own class, unless allowed")
    func refusesProduction() async throws {
        let refusing = SimulatedController(weights: [(.purchased, 1)])
        #expect(try await refusing.purchase(Self.request(.sandbox)) == .purchased)
        do {
            _ = try await refusing.purchase(Self.request(.production))
            Issue.record("a PRODUCTION request was answered")
        } catch let error as PurchaseControllerError {
            #expect(error.type == SimulatedController.refusedProductionType && !error.isRetryable)
        }
        let allowing = SimulatedController(weights: [(.purchased, 1)], allowsProduction: true)
        #expect(try await allowing.purchase(Self.request(.production)) == .purchased)
    }

    @Test("with no latency it answers at once what purchase(_:) answers, refusals included; with a latency, never")
    func immediateAnswers() async throws {
        let weights: [(answer: SimulatedController.Answer, weight: Double)] = [
            (.purchased, 5), (.cancelled, 3), (.retryableError, 1), (.error, 1),
        ]
        let controller = SimulatedController(weights: weights)
        func describe(_ result: Result<PurchaseResult, any Error>) -> String {
            switch result {
            case .success(let answer): "\(answer)"
            case .failure(let error): "\(error)"
            }
        }
        for index in 0..<200 {
            for attempt in 1...3 {
                let request = PurchaseRequest(
                    event: PurchaseRequestEvent(
                        requestID: "r-\(index)", appID: "app", appUserID: "u", productID: "p", store: .appStore,
                        environment: index % 10 == 0 ? .production : .sandbox, requestedAtMs: 1),
                    attempt: attempt)
                let called: Result<PurchaseResult, any Error>
                do { called = .success(try await controller.purchase(request)) } catch { called = .failure(error) }
                let immediate = try #require(controller.immediateAnswer(to: request))
                #expect(describe(immediate) == describe(called), "request \(index), attempt \(attempt)")
            }
        }
        let slow = SimulatedController(meanLatency: .milliseconds(1), weights: weights)
        #expect(slow.immediateAnswer(to: Self.request(.sandbox)) == nil)
    }
}
