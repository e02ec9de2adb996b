import EncoreEvents
import Foundation
import Testing

/// Runs `scripts/validate_events.py` (Python `jsonschema`) and returns its exit status and output.
/// The blocking wait happens on a dispatch thread, never on the cooperative pool other tests share.
func runValidator(_ arguments: [String]) async throws -> (status: Int32, output: String) {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async {
            do {
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
                process.arguments =
                    ["python3", repositoryRoot.appendingPathComponent("scripts/validate_events.py").path] + arguments
                let pipe = Pipe()
                process.standardOutput = pipe
                process.standardError = pipe
                try process.run()
                let output = pipe.fileHandleForReading.readDataToEndOfFile()
                process.waitUntilExit()
                continuation.resume(returning: (process.terminationStatus, String(decoding: output, as: UTF8.self)))
            } catch {
                continuation.resume(throwing: error)
            }
        }
    }
}

@Suite("Swift decoder and Python jsonschema agree")
struct IndependentValidatorTests {
    @Test("on every sample: same verdict, same field")
    func samplesAgree() async throws {
        for event in eventNames {
            let samples = allSamples().filter { $0.event == event }
            let (status, output) = try await runValidator(["verdicts", event] + samples.map(\.url.path))
            #expect(status == 0, "\(output)")
            let lines = output.split(separator: "\n").map {
                $0.split(separator: "\t", omittingEmptySubsequences: false)
            }
            #expect(lines.count == samples.count)
            for (sample, line) in zip(samples, lines) {
                let pythonValid = line[1] == "valid"
                switch swiftVerdict(event, sample.bytes) {
                case .success:
                    #expect(pythonValid, "\(sample.testDescription): Swift accepts, jsonschema rejects at \(line[2])")
                case .failure(let error):
                    #expect(!pythonValid, "\(sample.testDescription): Swift rejects (\(error)), jsonschema accepts")
                    let pythonField = line[2] == "_record" ? "" : String(line[2])
                    #expect(pythonField == error.field, "\(sample.testDescription)")
                }
            }
        }
    }

    @Test("on events the Swift code encodes")
    func encodedEventsValidate() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-encoded-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        func write(_ name: String, _ events: [[UInt8]]) throws {
            let lines = events.map { String(decoding: $0, as: UTF8.self) }.joined(separator: "\n")
            try Data(lines.utf8).write(to: directory.appendingPathComponent("\(name).jsonl"))
        }
        let requests = SampleEvents.requests(count: 200)
        try write("purchase-request", requests.map { $0.jsonBytes() })
        try write("purchase-outcome", SampleEvents.outcomes(for: requests).map { $0.jsonBytes() })
        try write("entitlement-change", SampleEvents.changes(count: 50).map { $0.jsonBytes() })
        try write("dead-letter", SampleEvents.deadLetters().map { $0.jsonBytes() })
        try write("entitlement-source", SampleEvents.sources(count: 20).map { $0.jsonBytes() })
        try write("entitlement-state", SampleEvents.states(count: 20).map { $0.jsonBytes() })
        try write("request-journal", SampleEvents.journal(count: 30).map { $0.jsonBytes() })
        for event in eventNames {
            let (status, output) = try await runValidator([
                "check", event, directory.appendingPathComponent("\(event).jsonl").path,
            ])
            #expect(status == 0, "\(event): \(output)")
        }
    }
}

/// Varied events exercising every optional field, enum case and escaping path of the encoders.
enum SampleEvents {
    static func requests(count: Int) -> [PurchaseRequestEvent] {
        (0..<count).map { index in
            PurchaseRequestEvent(
                requestID: "req-\(index)", appID: "app_\(index % 3)", appUserID: "user \"\(index)\"\n\u{1}ü😀",
                productID: ["rc_pro", "sk_yearly", "com.app.x"][index % 3] + "_\(index)",
                store: Store.allCases[index % Store.allCases.count],
                environment: PurchaseEnvironment.allCases[index % 2], requestedAtMs: 1_764_475_643_000 + Int64(index),
                placementID: index % 2 == 0 ? "placement-\(index)" : nil, promoOfferID: index % 5 == 0 ? "promo" : nil,
                campaignID: index % 3 == 0 ? "cmp" : nil, offerID: index % 4 == 0 ? "offer" : nil,
                entitlement: index % 2 == 0
                    ? Entitlement(
                        type: EntitlementType.allCases[index % 3], value: index % 7 == 0 ? 12.5 : Double(index % 30),
                        unit: EntitlementUnit.allCases[index % 4]) : nil,
                deadlineAtMs: index % 6 == 0 ? 1_764_475_943_000 : nil,
                attributes: index % 4 == 0 ? ["locale": "de-DE", "tab\t": "\\slash/"] : nil)
        }
    }

    static func outcomes(for requests: [PurchaseRequestEvent]) -> [PurchaseOutcomeEvent] {
        requests.enumerated().map { index, request in
            let result = OutcomeResult.allCases[index % OutcomeResult.allCases.count]
            return PurchaseOutcomeEvent(
                request: request, result: result, attempts: result == .notAttempted ? 0 : 1 + index % 3,
                completedAtMs: request.requestedAtMs + 40, controller: result == .notAttempted ? nil : "simulated",
                transactionID: result == .purchased ? "tx-\(index)" : nil,
                error: result == .failed
                    ? .init(
                        type: index % 2 == 0 ? "timeout" : "http_503", message: "billing said \"no\"",
                        retryable: index % 2 == 1)
                    : nil)
        }
    }

    static func sources(count: Int) -> [EntitlementSourceEvent] {
        let names = ["revenuecat", "superwall", "app_store"]
        var events: [EntitlementSourceEvent] = []
        for index in 0..<count {
            let expires: Int64? = index % 2 == 0 ? 1_765_080_443_000 : nil
            events.append(
                EntitlementSourceEvent(
                    appID: "app", appUserID: "user \"\(index)\"", source: names[index % 3],
                    entitlementID: index % 2 == 0 ? "pro" : "active", isActive: index % 3 != 0, expiresAtMs: expires,
                    eventID: "evt-\(index)", occurredAtMs: 1_764_475_643_000 + Int64(index)))
        }
        return events
    }

    static func states(count: Int) -> [EntitlementStateRecord] {
        var records: [EntitlementStateRecord] = []
        for index in 0..<count {
            var record = EntitlementStateRecord(
                appID: "app", appUserID: "user-\(index)\n", sequence: Int64(index), updatedAtMs: 1_764_475_643_000)
            for grant in 0..<(index % 3) {
                let expires: Int64? = grant % 2 == 0 ? 1_765_080_443_000 : nil
                record.grants.append(
                    .init(
                        productID: "trial_\(grant)", entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days),
                        status: grant % 2 == 0 ? .verified : .provisional, isActive: index % 2 == 0,
                        grantedAtMs: 1_764_475_643_000, expiresAtMs: expires, requestID: "req-\(index)-\(grant)",
                        campaignID: grant == 1 ? "cmp" : nil))
            }
            if index % 2 == 0 {
                record.sources.append(
                    .init(
                        source: "revenuecat", entitlementID: "pro", isActive: true, expiresAtMs: nil, eventID: "e",
                        occurredAtMs: 5))
            }
            if index % 4 == 0 { record.access = ["pro": true, "plus \"x\"": false] }
            records.append(record)
        }
        return records
    }

    /// Journal records: intents, results of every kind, decided failures, in-doubt marks.
    static func journal(count: Int) -> [JournalRecord] {
        (0..<count).map { index in
            let result = index % 3 == 0 ? nil : OutcomeResult.allCases[index % OutcomeResult.allCases.count]
            let failure =
                result == .failed
                ? PurchaseOutcomeEvent.Failure(type: "card_declined", message: "no \"funds\"\n", retryable: false) : nil
            return JournalRecord(
                appID: "app", appUserID: "user-\(index)\u{1F600}", seq: Int64(index * 7),
                entry: .init(
                    requestID: "req-\(index)", attempts: index % 5, startedAtMs: 1_764_475_643_000,
                    result: result, completedAtMs: result == nil ? nil : 1_764_475_643_100, error: failure,
                    controller: index % 2 == 0 ? "store" : nil, offset: index % 4 == 0 ? nil : Int64(index),
                    inDoubtSinceMs: index % 6 == 0 ? 1_764_475_643_050 : nil,
                    digest: index % 3 == 1 ? "00000000000000ff" : nil))
        }
    }

    static func changes(count: Int) -> [EntitlementChangeEvent] {
        (0..<count).map { index in
            EntitlementChangeEvent(
                appID: "app", appUserID: "user-\(index)",
                change: EntitlementChangeKind.allCases[index % EntitlementChangeKind.allCases.count],
                entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days),
                status: EntitlementStatus.allCases[index % 2], access: index % 7 == 0 ? "pro" : nil,
                isActive: index % 3 != 0, effectiveAtMs: 1_764_475_643_000, sequence: Int64(index + 1),
                expiresAtMs: index % 2 == 0 ? 1_765_080_443_000 : nil, requestID: "req-\(index)",
                sources: index % 5 == 0
                    ? [
                        .init(source: "revenuecat", isActive: true, entitlementID: "pro"),
                        .init(source: "encore", isActive: false),
                    ]
                    : nil)
        }
    }

    static func deadLetters() -> [DeadLetterEvent] {
        [
            DeadLetterEvent(
                topic: "encore.purchase-requests", partition: 2, offset: 99, key: [0xFF, 0x00], value: [0xC3, 0x28],
                headers: [("ce_id", Array("x".utf8)), ("bin", [0xFF]), ("nil", nil)],
                error: .init(EventValidationError(.notUTF8, field: "", "the record value is not valid UTF-8")),
                attempts: 0, failedAtMs: 1_764_475_643_000),
            DeadLetterEvent(
                topic: "encore.purchase-requests", partition: 0, offset: 0, key: Array("app:u".utf8),
                value: Array("{\"request_id\":\"r\"}".utf8), headers: [],
                error: .init(
                    EventValidationError(.missingField, field: "app_id", "required field 'app_id' is missing")),
                attempts: 0, failedAtMs: 1_764_475_643_000, requestID: "r"),
            DeadLetterEvent(
                topic: "t", partition: 1, offset: 5, key: nil,
                value: Array(repeating: UInt8(ascii: "x"), count: 300_000),
                headers: [],
                error: .init(stage: .controller, errorClass: "timeout", message: "took too long", retryable: false),
                attempts: 1, failedAtMs: 1),
        ]
    }
}
