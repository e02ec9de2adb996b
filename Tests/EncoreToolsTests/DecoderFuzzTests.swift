import EncoreTools
import Foundation
import Testing

@testable import EncoreEvents

/// Mutated records through every decoder. `ENCORE_FUZZ_RECORDS` sets how many (CI runs the
/// default; `scripts/fuzz.sh` runs 100,000), `ENCORE_FUZZ_SEED` which ones.
@Suite("Decoder fuzzing")
struct DecoderFuzzTests {
    static let environment = ProcessInfo.processInfo.environment
    static let count = environment["ENCORE_FUZZ_RECORDS"].flatMap(Int.init) ?? 4_000
    static let seed = environment["ENCORE_FUZZ_SEED"].flatMap(UInt64.init) ?? 7

    @Test("no crash or hang; a rejection names its field and reason; the fast decoder agrees; valid ones round-trip")
    func decoders() throws {
        var fuzzer = RecordFuzzer(seed: Self.seed)
        var verdicts: [RecordFuzzer.Mutation: (valid: Int, invalid: Int)] = [:]
        for index in 0..<Self.count {
            let record = fuzzer.next()
            let context = "seed \(Self.seed) record \(index) (\(record.mutation))"
            let fast = record.value.withUnsafeBufferPointer(PurchaseRequestEvent.table.decodeFast)
            do throws(EventValidationError) {
                let request = try PurchaseRequestEvent(jsonBytes: record.value)
                verdicts[record.mutation, default: (0, 0)].valid += 1
                if let fast { #expect(fast == request, "\(context)") }
                #expect(try PurchaseRequestEvent(jsonBytes: request.jsonBytes()) == request, "\(context)")
            } catch {
                verdicts[record.mutation, default: (0, 0)].invalid += 1
                #expect(fast == nil, "\(context): the fast decoder accepted what the general one refused")
                #expect(!error.message.isEmpty, "\(context)")
                // A rejection names the field at fault (none for a record that is not a JSON object).
                #expect(error.field.isEmpty || error.message.contains(error.field), "\(context): \(error)")
            }
            // The other decoders meet the same bytes on a misrouted topic: they must refuse, not crash.
            _ = try? EntitlementSourceEvent(jsonBytes: record.value)
            _ = try? DeadLetterEvent(jsonBytes: record.value)
            _ = try? EntitlementStateRecord(jsonBytes: record.value)
        }
        // The fuzzer's own baseline: untouched records and null optionals are valid, empty values are not.
        #expect(verdicts[.untouched].map { $0.invalid == 0 && $0.valid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.nullOptionals].map { $0.invalid == 0 && $0.valid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.emptyValue].map { $0.valid == 0 && $0.invalid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.deepNesting].map { $0.valid == 0 } ?? false, "\(verdicts)")
    }

    @Test("the same seed gives the same records")
    func reproducible() {
        var first = RecordFuzzer(seed: 3)
        var second = RecordFuzzer(seed: 3)
        for _ in 0..<200 {
            let (a, b) = (first.next(), second.next())
            #expect(a.value == b.value && a.key == b.key && a.headers == b.headers && a.mutation == b.mutation)
        }
    }
}
