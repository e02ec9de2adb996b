import EncoreEvents
import EncoreTools
import Testing

@Suite("Request generator")
struct RequestGeneratorTests {
    func records(_ options: RequestGenerator.Options, count: Int) -> [RequestGenerator.Record] {
        var generator = RequestGenerator(options: options)
        return (0..<count).map { generator.next(nowMs: 1_764_475_643_000 + Int64($0)) }
    }

    @Test("the same seed gives the same records; another seed does not")
    func deterministic() {
        var options = RequestGenerator.Options()
        options.duplicateRatio = 0.1
        options.invalidRatio = 0.1
        options.skew = 1.1
        options.seed = 5
        let first = records(options, count: 2000)
        let second = records(options, count: 2000)
        #expect(first.map(\.value) == second.map(\.value))
        #expect(first.map(\.key) == second.map(\.key))
        options.seed = 6
        #expect(records(options, count: 2000).map(\.value) != first.map(\.value))
    }

    @Test("duplicate and invalid shares hold within tolerance over 10,000 records, every invalid kind appears")
    func ratios() throws {
        var options = RequestGenerator.Options()
        options.duplicateRatio = 0.05
        options.invalidRatio = 0.08
        options.seed = 9
        let generated = records(options, count: 10_000)
        let duplicates = generated.filter { $0.kind == .duplicate }
        let invalid = generated.compactMap { record -> RequestGenerator.InvalidKind? in
            if case .invalid(let kind) = record.kind { return kind }
            return nil
        }
        #expect(abs(Double(duplicates.count) / 10_000 - 0.05) < 0.01, "\(duplicates.count) duplicates")
        #expect(abs(Double(invalid.count) / 10_000 - 0.08) < 0.01, "\(invalid.count) invalid")
        #expect(Set(invalid) == Set(RequestGenerator.InvalidKind.allCases))
        // Invalid records are rejected with the code their kind promises; the rest decode.
        var seen = Set<String>()
        for record in generated {
            switch record.kind {
            case .invalid(let kind):
                do {
                    _ = try PurchaseRequestEvent(jsonBytes: record.value)
                    Issue.record("\(kind) decoded")
                } catch {
                    #expect(error.code == kind.expectedCode, "\(kind): \(error)")
                }
            case .duplicate:
                let event = try PurchaseRequestEvent(jsonBytes: record.value)
                #expect(seen.contains(event.requestID), "a duplicate repeats an earlier request")
            case .valid:
                let event = try PurchaseRequestEvent(jsonBytes: record.value)
                #expect(seen.insert(event.requestID).inserted)
                #expect(record.key == Array(event.key.utf8))
            }
        }
    }

    @Test("a Zipf skew concentrates requests on few users; zero skew spreads them")
    func skew() throws {
        var options = RequestGenerator.Options()
        options.users = 1000
        options.skew = 1.2
        let skewed = try records(options, count: 10_000).map { try PurchaseRequestEvent(jsonBytes: $0.value).appUserID }
        options.skew = 0
        let uniform = try records(options, count: 10_000).map {
            try PurchaseRequestEvent(jsonBytes: $0.value).appUserID
        }
        func topShare(_ users: [String]) -> Double {
            let counts = Dictionary(grouping: users, by: { $0 }).values.map(\.count).sorted(by: >)
            return Double(counts.prefix(10).reduce(0, +)) / Double(users.count)
        }
        #expect(topShare(skewed) > 0.3)
        #expect(topShare(uniform) < 0.05)
    }

    @Test("the product mix follows the weights and keeps routing prefixes")
    func products() throws {
        var options = RequestGenerator.Options()
        options.products = [.init(id: "rc_a", weight: 3), .init(id: "sk_b", weight: 1)]
        let products = try records(options, count: 8000).map { try PurchaseRequestEvent(jsonBytes: $0.value).productID }
        let share = Double(products.filter { $0 == "rc_a" }.count) / 8000
        #expect(abs(share - 0.75) < 0.03)
    }
}
