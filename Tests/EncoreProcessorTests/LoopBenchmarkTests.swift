import EncoreEvents
import Foundation
@testable import EncoreProcessor
import Testing

@Suite("bench --no-kafka: the dispatch loop alone")
struct LoopBenchmarkTests {
    @Test("every request reaches an outcome and is finished; the CPU is counted")
    func processesEverything() async {
        var options = LoopBenchmark.Options()
        options.count = 3000
        options.users = 100
        options.timeout = .seconds(120)
        let report = await LoopBenchmark.run(options)
        #expect(report.processed == 3000 && report.outcomes == 3000)
        #expect(report.cpuSeconds > 0 && report.elapsedSeconds > 0)
    }
}

@Suite("bench --no-kafka's requests")
struct LoopBenchmarkRequestTests {
    @Test("are the ones limit.c fills make bench's topics with: id, user, product, size")
    func limitShaped() throws {
        // Computed from ../shared/bench/limit.c's make_event (mix64, the id's format, USERS=10000).
        for (index, user, requestID) in [
            (0, 7535, "09f1fd9d-03f0-4a9b-89b4-000000000000"), (1, 2465, "be3f90b2-0967-44ee-8eec-000000000001"),
            (123_456, 777, "1a3bac2a-b2ae-4ef7-8f7a-00000001e240"),
        ] {
            let (event, drawn) = LoopBenchmark.limitRequest(index, users: 10_000)
            #expect(drawn == user && event.appUserID == String(format: "user-%06d", user))
            #expect(event.requestID == requestID)
            #expect(event.productID == "com.app.monthly_premium" && event.environment == .production)
            #expect(event.attributes == ["pad": ""] && event.jsonBytes().count == 273, "limit.c's are 273 bytes")
            #expect(try PurchaseRequestEvent(jsonBytes: event.jsonBytes()) == event)
        }
    }
}
