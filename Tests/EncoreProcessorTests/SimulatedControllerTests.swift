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
}
