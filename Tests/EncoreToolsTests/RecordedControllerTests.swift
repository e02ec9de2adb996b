import EncoreEvents
import EncoreProcessor
import EncoreTools
import Testing

@Suite("Recorded controller")
struct RecordedControllerTests {
    static func request(_ id: String) -> PurchaseRequest {
        PurchaseRequest(
            event: PurchaseRequestEvent(
                requestID: id, appID: "app", appUserID: "u", productID: "p", store: .appStore,
                environment: .sandbox, requestedAtMs: 1))
    }

    static func outcome(_ id: String, _ result: OutcomeResult, error: PurchaseOutcomeEvent.Failure? = nil)
        -> RecordedController.Recording
    {
        RecordedController.Recording(
            PurchaseOutcomeEvent(
                request: request(id).event, result: result, attempts: 1, completedAtMs: 2, error: error))
    }

    @Test("answers what production answered; a failure again, final; nothing recorded: not attempted")
    func answers() async throws {
        let controller = RecordedController(recordings: [
            "a": Self.outcome("a", .purchased), "b": Self.outcome("b", .pending),
            "c": Self.outcome("c", .failed, error: .init(type: "declined", message: "card", retryable: true)),
            "d": Self.outcome(
                "d", .notAttempted, error: .init(type: "deadline_exceeded", message: "late", retryable: false)),
        ])
        #expect(try await controller.purchase(Self.request("a")) == .purchased)
        #expect(try await controller.purchase(Self.request("b")) == .pending)
        await #expect(throws: PurchaseControllerError.final("declined", "card")) {
            try await controller.purchase(Self.request("c"))
        }
        await #expect(throws: PurchaseNotAttempted(type: "deadline_exceeded", message: "late")) {
            try await controller.purchase(Self.request("d"))
        }
        do {
            _ = try await controller.purchase(Self.request("e"))
            Issue.record("an unrecorded request was answered")
        } catch let error as PurchaseNotAttempted {
            #expect(error.type == "no_recorded_outcome")
        }
        #expect(controller.calls == (answered: 4, unrecorded: 1))
    }
}
