import Testing

@testable import EncoreEvents

/// The outcome's hand-written encoder against its field table, which the decoder, the fast path
/// and the schema agreement read: the same bytes for every shape an outcome takes.
@Suite("Purchase outcome encoding")
struct PurchaseOutcomeEncodingTests {
    @Test(
        "2,000 outcomes, each optional field present or absent, every result, store and environment, errors with escapes and past their limits: the table's bytes, and they decode back"
    )
    func sameBytesAsTheTable() throws {
        var random = RequestJournalEncodingTests.SplitMix64(state: 43)
        func maybe<T>(_ value: T) -> T? { Bool.random(using: &random) ? value : nil }
        let messages = [
            "card declined", "quote \" and backslash \\ and\nnewline\t", String(repeating: "é", count: 1500),
        ]
        for step in 0..<2_000 {
            let result = OutcomeResult.allCases[step % OutcomeResult.allCases.count]
            let error = PurchaseOutcomeEvent.Failure(
                type: ["", "billing.declined", String(repeating: "t", count: 200)][step % 3],
                message: messages[Int(random.next() % 3)], retryable: Bool.random(using: &random))
            let outcome = PurchaseOutcomeEvent(
                requestID: "req-\(step)-\u{1F600}", appID: "app_\(step % 7)", appUserID: "user \"\(step)\"",
                productID: "pro.\(step % 3)", result: result, attempts: Int(random.next() % 5),
                store: Store.allCases[Int(random.next() % UInt64(Store.allCases.count))],
                environment: PurchaseEnvironment.allCases[step % PurchaseEnvironment.allCases.count],
                requestedAtMs: Int64(random.next() % 2_000_000_000_000), completedAtMs: Int64(step) * 1_000 + 7,
                placementID: maybe("placement \(step)"), promoOfferID: maybe("promo"), controller: maybe("stripe"),
                transactionID: maybe("tx-\(random.next())"), error: result == .failed ? error : nil,
                pendingReason: result == .pending
                    ? maybe(PendingReason.allCases[step % PendingReason.allCases.count]) : nil)
            let bytes = outcome.jsonBytes()
            #expect(bytes == PurchaseOutcomeEvent.table.encode(outcome), "outcome \(step)")
            // What a reader gets: the outcome again, the error as it was written.
            var written = outcome
            if let error = outcome.error {
                written.error = PurchaseOutcomeEvent.Failure(
                    type: error.wireType, message: error.wireMessage, retryable: error.retryable)
            }
            #expect(try PurchaseOutcomeEvent(jsonBytes: bytes) == written, "outcome \(step)")
        }
    }

    @Test("an outcome with every field set writes every field its table (and schema) names")
    func everyField() {
        // (Both `error` and `pending_reason` at once is not valid, but the encoder writes what it holds.)
        var outcome = PurchaseOutcomeEvent(
            requestID: "r", appID: "app", appUserID: "u", productID: "p", result: .pending, attempts: 2,
            store: .playStore, environment: .sandbox, requestedAtMs: 1, completedAtMs: 2, placementID: "pl",
            promoOfferID: "po", controller: "c", transactionID: "t", pendingReason: .outcomeUnknown)
        outcome.error = PurchaseOutcomeEvent.Failure(type: "t", message: "m", retryable: false)
        let written = String(decoding: outcome.jsonBytes(), as: UTF8.self)
        #expect(outcome.jsonBytes() == PurchaseOutcomeEvent.table.encode(outcome))
        for field in PurchaseOutcomeEvent.table.schema {
            #expect(written.contains("\"\(field.name)\":"), "\(field.name) in \(written)")
        }
    }
}
