import EncoreEvents
import EncoreProcessor
import Kafka

/// Mutated purchase-request records for fuzzing the decoders and a running processor: bit flips,
/// truncations, wrong types, deep nesting, huge strings and numbers, invalid UTF-8, duplicate
/// keys, empty and huge values, missing or garbage keys and headers. Seeded: record `n` of seed
/// `s` is always the same, so a failure is reproduced from the two numbers.
public struct RecordFuzzer {
    /// A record to produce: key, value and headers as a client might send them.
    public struct Record: Sendable {
        public var key: [UInt8]?
        public var value: [UInt8]
        public var headers: [KafkaHeader]
        /// What was done to the valid record it started from.
        public var mutation: Mutation
    }

    /// What was done to a valid request to make the record.
    public enum Mutation: String, CaseIterable, Sendable {
        case untouched, bitFlips, truncation, wrongType, deepNesting, hugeString, hugeNumber, invalidUTF8
        case duplicateKey, emptyValue, hugeValue, garbageKey, missingKey, garbageHeaders, nullOptionals
    }

    private var random: SplitMix64
    private var generator: RequestGenerator
    /// The largest value made; keep it below the broker's `message.max.bytes` (1 MB by default)
    /// and, on librdkafka's mock cluster, well below its ~5 MiB per partition.
    public let largestValue: Int

    public init(seed: UInt64, largestValue: Int = 300_000) {
        precondition(largestValue >= 2_000)
        self.largestValue = largestValue
        random = SplitMix64(seed: seed)
        var options = RequestGenerator.Options()
        options.seed = seed
        options.users = 500
        generator = RequestGenerator(options: options)
    }

    /// The next record: a generated request, mutated one way (or left valid).
    public mutating func next() -> Record {
        var base = generator.next(nowMs: 1_764_475_643_000)
        // A request id no bit flip turns into another record's id.
        let id = "req-\(String(random.next(), radix: 16))"
        if let original = base.requestID {
            base.value = Array(
                String(decoding: base.value, as: UTF8.self).replacingOccurrences(
                    of: "\"\(original)\"", with: "\"\(id)\""
                ).utf8)
        }
        let mutation = Mutation.allCases[Int(random.next() % UInt64(Mutation.allCases.count))]
        var record = Record(key: base.key, value: base.value, headers: [], mutation: mutation)
        mutate(&record)
        return record
    }

    private mutating func below(_ bound: Int) -> Int { bound <= 0 ? 0 : Int(random.next() % UInt64(bound)) }

    private mutating func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in UInt8(truncatingIfNeeded: random.next()) }
    }

    private var fields: [String] {
        [
            "request_id", "app_id", "app_user_id", "product_id", "store", "environment", "requested_at_ms",
            "placement_id", "entitlement", "attributes", "deadline_at_ms",
        ]
    }

    /// `value` with field `name`'s value replaced by `replacement` (added when absent).
    private func replacing(_ name: String, with replacement: String, in value: [UInt8]) -> [UInt8] {
        var text = String(decoding: value, as: UTF8.self)
        if let range = text.range(of: "\"\(name)\":") {
            // Up to the next comma or closing brace at this level (values here hold neither).
            var end = range.upperBound
            var depth = 0
            var inString = false
            while end < text.endIndex {
                let character = text[end]
                if character == "\"" { inString.toggle() }
                if !inString {
                    if character == "{" || character == "[" { depth += 1 }
                    if character == "}" || character == "]" {
                        if depth == 0 { break }
                        depth -= 1
                    }
                    if character == "," && depth == 0 { break }
                }
                end = text.index(after: end)
            }
            text.replaceSubrange(range.upperBound..<end, with: replacement)
        } else if text.hasSuffix("}") {
            text.removeLast()
            text += ",\"\(name)\":\(replacement)}"
        }
        return Array(text.utf8)
    }

    private mutating func mutate(_ record: inout Record) {
        let field = fields[below(fields.count)]
        switch record.mutation {
        case .untouched:
            break
        case .bitFlips:
            for _ in 0...below(8) where !record.value.isEmpty {
                record.value[below(record.value.count)] ^= 1 << UInt8(below(8))
            }
        case .truncation:
            record.value = Array(record.value.prefix(below(record.value.count)))
        case .wrongType:
            // A string value is unique: two records never share a request id by chance.
            let values = [
                "12", "-1", "\"text-\(String(random.next(), radix: 16))\"", "true", "[]", "{}", "[1,\"a\"]",
                "{\"a\":{}}", "1.5", "\"\"",
            ]
            record.value = replacing(field, with: values[below(values.count)], in: record.value)
        case .deepNesting:
            let depth = [10, 200, 10_000, 100_000][below(4)]
            record.value = replacing(
                field, with: String(repeating: "[", count: depth) + String(repeating: "]", count: depth),
                in: record.value)
        case .hugeString:
            let length = [257, 1_000, largestValue / 2][below(3)]
            record.value = replacing(field, with: "\"\(String(repeating: "x", count: length))\"", in: record.value)
        case .hugeNumber:
            let numbers = [
                "1e400", "-1e400", "123456789012345678901234567890", "9223372036854775808", "-0", "1e-400",
                "9223372036854775807", "0.0000001", "1E2",
            ]
            record.value = replacing(field, with: numbers[below(numbers.count)], in: record.value)
        case .invalidUTF8:
            let sequences: [[UInt8]] = [[0xFF], [0xC3, 0x28], [0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xF8, 0x88, 0x80]]
            let sequence = sequences[below(sequences.count)]
            record.value.insert(contentsOf: sequence, at: below(record.value.count + 1))
        case .duplicateKey:
            let values = ["\"dup-\(String(random.next(), radix: 16))\"", "1", "null", "{}"]
            if record.value.last == UInt8(ascii: "}") {
                record.value.removeLast()
                record.value += Array(",\"\(field)\":\(values[below(values.count)])}".utf8)
            }
        case .emptyValue:
            record.value = []
        case .hugeValue:
            record.value = bytes(largestValue - below(1000))
        case .garbageKey:
            record.key = bytes([0, 1, 64, 10_000][below(4)])
        case .missingKey:
            record.key = nil
        case .garbageHeaders:
            record.headers = (0..<below(40)).map { _ in
                KafkaHeader(key: String(decoding: bytes(below(20)), as: UTF8.self), value: bytes(below(2000)))
            }
        case .nullOptionals:
            for name in ["placement_id", "entitlement", "attributes", "deadline_at_ms", "promo_offer_id"] {
                record.value = replacing(name, with: "null", in: record.value)
            }
        }
    }
}
