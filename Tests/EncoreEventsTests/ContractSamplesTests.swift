import EncoreEvents
import Foundation
import Testing

/// The repository root, found from this file's path.
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

struct Sample: CustomTestStringConvertible, Sendable {
    let event: String
    let url: URL
    var isValid: Bool { url.deletingLastPathComponent().lastPathComponent == "valid" }
    /// For invalid samples: the field named before `--` in the file name (`""` for the whole record).
    var expectedField: String {
        let field = String(url.deletingPathExtension().lastPathComponent.split(separator: "--")[0])
        return field == "_record" ? "" : field
    }
    var testDescription: String {
        "\(event)/\(url.deletingLastPathComponent().lastPathComponent)/\(url.lastPathComponent)"
    }
    var bytes: [UInt8] { Array(try! Data(contentsOf: url)) }
}

/// Every schema in `schemas/`, by name.
let eventNames = [
    "purchase-request", "purchase-outcome", "entitlement-change", "dead-letter", "entitlement-source",
    "entitlement-state", "request-journal",
]

func allSamples() -> [Sample] {
    let examples = repositoryRoot.appendingPathComponent("schemas/examples")
    var samples: [Sample] = []
    for event in eventNames {
        for kind in ["valid", "invalid"] {
            let directory = examples.appendingPathComponent("\(event)/\(kind)")
            let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
            for name in names.sorted() where name.hasSuffix(".json") {
                samples.append(Sample(event: event, url: directory.appendingPathComponent(name)))
            }
        }
    }
    return samples
}

/// Decodes `bytes` as `event`; returns the re-encoded bytes or the validation error.
func swiftVerdict(_ event: String, _ bytes: [UInt8]) -> Result<[UInt8], EventValidationError> {
    func run<E: EncoreEvent>(_ type: E.Type) -> Result<[UInt8], EventValidationError> {
        do throws(EventValidationError) {
            let decoded = try E(jsonBytes: bytes)
            let reencoded = decoded.jsonBytes()
            // Encoding is lossless for what the contract defines.
            #expect(try E(jsonBytes: reencoded) == decoded)
            return .success(reencoded)
        } catch {
            return .failure(error)
        }
    }
    switch event {
    case "purchase-request": return run(PurchaseRequestEvent.self)
    case "purchase-outcome": return run(PurchaseOutcomeEvent.self)
    case "entitlement-change": return run(EntitlementChangeEvent.self)
    case "entitlement-source": return run(EntitlementSourceEvent.self)
    case "entitlement-state": return run(EntitlementStateRecord.self)
    case "request-journal": return run(JournalRecord.self)
    default: return run(DeadLetterEvent.self)
    }
}

@Suite("Contract samples in schemas/examples")
struct ContractSamplesTests {
    @Test("there are valid and invalid samples of every event")
    func samplesExist() {
        let samples = allSamples()
        for event in eventNames {
            #expect(samples.contains { $0.event == event && $0.isValid })
            #expect(samples.contains { $0.event == event && !$0.isValid })
        }
    }

    @Test("valid samples decode and round-trip", arguments: allSamples().filter(\.isValid))
    func validSample(_ sample: Sample) throws {
        let verdict = swiftVerdict(sample.event, sample.bytes)
        let encoded = try verdict.get()
        // Apart from unknown fields (ignored) and nulls (absent), the re-encoded JSON is the sample's JSON.
        if !sample.url.lastPathComponent.contains("unknown-fields") && !sample.url.lastPathComponent.contains("null") {
            #expect(try JSONValue.parse(encoded) == JSONValue.parse(sample.bytes))
        }
    }

    @Test("invalid samples are rejected naming the field at fault", arguments: allSamples().filter { !$0.isValid })
    func invalidSample(_ sample: Sample) {
        switch swiftVerdict(sample.event, sample.bytes) {
        case .success:
            Issue.record("accepted an invalid sample")
        case .failure(let error):
            #expect(error.field == sample.expectedField, "\(error)")
            #expect(!error.message.isEmpty)
        }
    }
}
