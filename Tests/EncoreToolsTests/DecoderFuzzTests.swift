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
    func decoders() async throws {
        // Tens of seconds of decoding in a debug build: on a thread of its own, not on one of the
        // cooperative pool's (one per core), which the suites waiting on a loop need meanwhile.
        let (problems, verdicts) = await onOwnThread { Self.fuzz() }
        #expect(problems.isEmpty, "\(problems.count) problems, the first: \(problems.prefix(10))")
        // The fuzzer's own baseline: untouched records and null optionals are valid, empty values are not.
        #expect(verdicts[.untouched].map { $0.invalid == 0 && $0.valid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.nullOptionals].map { $0.invalid == 0 && $0.valid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.emptyValue].map { $0.valid == 0 && $0.invalid > 0 } ?? false, "\(verdicts)")
        #expect(verdicts[.deepNesting].map { $0.valid == 0 } ?? false, "\(verdicts)")
    }

    /// Every mutated record through every decoder; what went wrong, and the verdicts by mutation.
    static func fuzz() -> (problems: [String], verdicts: [RecordFuzzer.Mutation: Verdicts]) {
        var fuzzer = RecordFuzzer(seed: seed)
        var verdicts: [RecordFuzzer.Mutation: Verdicts] = [:]
        var problems: [String] = []
        for index in 0..<count {
            let record = fuzzer.next()
            let context = "seed \(seed) record \(index) (\(record.mutation))"
            let fast = record.value.withUnsafeBufferPointer(PurchaseRequestEvent.table.decodeFast)
            // The decoder for a consumer's bytes and the generic one give one answer: the request's
            // own (specialized), and the protocol's default (another type's).
            if !Self.bothPathsAgree(PurchaseRequestEvent.self, record.value) {
                problems.append("\(context): the request's array and slice decoders disagree")
            }
            if !Self.bothPathsAgree(EntitlementSourceEvent.self, record.value) {
                problems.append("\(context): the source event's array and slice decoders disagree")
            }
            do throws(EventValidationError) {
                let request = try PurchaseRequestEvent(jsonBytes: record.value)
                verdicts[record.mutation, default: Verdicts()].valid += 1
                if let fast, fast != request { problems.append("\(context): the fast decoder disagrees") }
                if (try? PurchaseRequestEvent(jsonBytes: request.jsonBytes())) != request {
                    problems.append("\(context): does not round-trip")
                }
            } catch {
                verdicts[record.mutation, default: Verdicts()].invalid += 1
                if fast != nil { problems.append("\(context): the fast decoder accepted what the general one refused") }
                if error.message.isEmpty { problems.append("\(context): an empty message") }
                // A rejection names the field at fault (none for a record that is not a JSON object).
                if !(error.field.isEmpty || error.message.contains(error.field)) {
                    problems.append("\(context): the message does not name the field: \(error)")
                }
            }
            // The other decoders meet the same bytes on a misrouted topic: they must refuse, not crash.
            _ = try? EntitlementSourceEvent(jsonBytes: record.value)
            _ = try? DeadLetterEvent(jsonBytes: record.value)
            _ = try? EntitlementStateRecord(jsonBytes: record.value)
        }
        return (problems, verdicts)
    }

    /// Whether decoding `bytes` as an array (``EncoreEvent/init(jsonBytes:)-([UInt8])``) and as a
    /// slice (the generic requirement) gives the same event or the same error.
    static func bothPathsAgree<Event: EncoreEvent>(_ type: Event.Type, _ bytes: [UInt8]) -> Bool {
        let viaArray = Result { () throws(EventValidationError) in try Event(jsonBytes: bytes) }
        let viaSlice = Result { () throws(EventValidationError) in try Event(jsonBytes: bytes[...]) }
        return viaArray == viaSlice
    }

    struct Verdicts: Sendable, CustomStringConvertible {
        var valid = 0
        var invalid = 0
        var description: String { "(valid: \(valid), invalid: \(invalid))" }
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

/// Runs `body` on a thread of its own and returns what it returns.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: body()) }.start()
    }
}
