import EncoreEvents
import EncoreTools
import Kafka
import Testing

/// The audit's checks on hand-made topics: each discrepancy is found exactly when it is there.
@Suite("Pipeline audit")
struct PipelineAuditTests {
    static let topics: [PipelineAudit.Topic: String] = [
        .requests: "requests", .outcomes: "outcomes", .changes: "changes", .state: "state", .deadLetters: "dead",
    ]
    static let trial = Entitlement(type: .freeTrial, value: 7, unit: .days)

    /// Topics as lists of records; offsets are positions in the list of the record's partition.
    struct Topics {
        var records: [PipelineAudit.Topic: [KafkaMessage]] = [:]

        mutating func append(_ topic: PipelineAudit.Topic, _ value: [UInt8], key: String? = nil, at ms: Int64 = 1000) {
            let partition: Int32 = 0
            let offset = Int64(records[topic, default: []].filter { $0.partition == partition }.count)
            records[topic, default: []].append(
                KafkaMessage(
                    topic: PipelineAuditTests.topics[topic]!, partition: partition, offset: offset,
                    key: key.map { Array($0.utf8) }, value: value, timestampMs: ms))
        }

        func audit(_ range: PipelineAudit.Range = .init()) -> AuditReport {
            var audit = PipelineAudit(range: range, topics: PipelineAuditTests.topics)
            for topic in PipelineAudit.Topic.allCases {
                for message in records[topic, default: []] { audit.read(message, of: topic) }
            }
            return audit.finish()
        }
    }

    static func request(_ id: String, user: String = "u1") -> PurchaseRequestEvent {
        PurchaseRequestEvent(
            requestID: id, appID: "app", appUserID: user, productID: "p-\(id)", store: .appStore,
            environment: .sandbox, requestedAtMs: 1000)
    }

    /// A clean history: two requests of u1 (one purchased and granted, one cancelled), one of u2
    /// (failed, dead-lettered), and one invalid record, dead-lettered.
    static func clean() -> Topics {
        var topics = Topics()
        let first = request("r1")
        let second = request("r2")
        let third = request("r3", user: "u2")
        for (index, event) in [first, second, third].enumerated() {
            topics.append(.requests, event.jsonBytes(), key: event.key, at: 1000 + Int64(index))
        }
        topics.append(.requests, Array("{\"request_id\":\"bad-1\"}".utf8), at: 1003)
        let purchased = PurchaseOutcomeEvent(
            request: first, result: .purchased, attempts: 1, completedAtMs: 1100, controller: "simulated")
        topics.append(.outcomes, purchased.jsonBytes(), key: first.key)
        topics.append(
            .outcomes,
            PurchaseOutcomeEvent(request: second, result: .cancelled, attempts: 1, completedAtMs: 1200).jsonBytes(),
            key: second.key)
        topics.append(
            .outcomes,
            PurchaseOutcomeEvent(
                request: third, result: .failed, attempts: 3, completedAtMs: 1300,
                error: .init(type: "timeout", message: "slow", retryable: true)
            ).jsonBytes(), key: third.key)
        let grant = EntitlementChangeEvent(
            appID: "app", appUserID: "u1", change: .granted, entitlement: trial, status: .verified, isActive: true,
            effectiveAtMs: 1100, sequence: 1, requestID: "r1")
        topics.append(.changes, grant.jsonBytes(), key: grant.key)
        let state = EntitlementStateRecord(
            appID: "app", appUserID: "u1", sequence: 1, updatedAtMs: 1100,
            grants: [
                .init(
                    productID: "p-r1", entitlement: trial, status: .verified, isActive: true, grantedAtMs: 1100,
                    expiresAtMs: nil, requestID: "r1")
            ])
        topics.append(.state, state.jsonBytes(), key: state.key)
        for (offset, id) in [(Int64(3), "bad-1"), (2, "r3")] {
            let letter = DeadLetterEvent(
                originalTopic: "requests", originalPartition: 0, originalOffset: offset,
                originalValue: .init(bytes: []),
                error: .init(
                    stage: id == "r3" ? .controller : .validate, errorClass: "x", message: "m", retryable: false),
                attempts: 1, failedAtMs: 1300, requestID: id)
            topics.append(.deadLetters, letter.jsonBytes())
        }
        return topics
    }

    @Test("a clean history has no discrepancies; its figures count what is there")
    func cleanHistory() {
        let report = Self.clean().audit()
        #expect(report.failures == 0, "\(report.table())")
        #expect(report.count(.invalidRequests) == 1)
        #expect(report.figures.requests == 3)
        #expect(report.figures.outcomesByResult == ["purchased": 1, "cancelled": 1, "failed": 1])
        #expect(report.figures.deadLettersByStage == ["validate": 1, "controller": 1])
        #expect(report.figures.changesByKind == ["granted": 1])
        #expect(report.figures.latencyMs.max == 298)
    }

    @Test("each planted discrepancy is found, once, with its request and coordinates")
    func planted() throws {
        var topics = Self.clean()
        // A request never answered.
        let late = Self.request("r4", user: "u3")
        topics.append(.requests, late.jsonBytes(), key: late.key, at: 1004)
        // An outcome repeated, one contradicted, one for no request at all.
        let first = Self.request("r1")
        topics.append(
            .outcomes,
            PurchaseOutcomeEvent(request: first, result: .purchased, attempts: 1, completedAtMs: 1100).jsonBytes())
        topics.append(
            .outcomes,
            PurchaseOutcomeEvent(request: first, result: .cancelled, attempts: 1, completedAtMs: 1100).jsonBytes())
        topics.append(
            .outcomes,
            PurchaseOutcomeEvent(
                request: Self.request("ghost"), result: .purchased, attempts: 1, completedAtMs: 1500
            ).jsonBytes())
        let report = topics.audit()
        #expect(report.count(.missingOutcomes) == 1)
        #expect(report.examples[.missingOutcomes]?.first?.requestID == "r4")
        #expect(report.examples[.missingOutcomes]?.first?.at.offset == 4)
        #expect(report.count(.duplicateOutcomes) == 1)
        #expect(report.count(.conflictingOutcomes) == 1)
        #expect(report.examples[.conflictingOutcomes]?.first?.at.offset == 4)
        #expect(report.count(.orphanOutcomes) == 1)
        #expect(report.examples[.orphanOutcomes]?.first?.requestID == "ghost")
        #expect(report.failures == 4, "\(report.table())")
    }

    @Test("an invalid record without a dead letter is undead")
    func undead() {
        var topics = Self.clean()
        topics.records[.deadLetters]?.removeAll { (try? DeadLetterEvent(jsonBytes: $0.value))?.requestID == "bad-1" }
        let report = topics.audit()
        #expect(report.count(.undeadInvalid) == 1)
        #expect(report.failures == 1)
    }

    @Test("a user's outcomes out of the order of their requests")
    func order() {
        var topics = Self.clean()
        // r2's outcome published before r1's.
        topics.records[.outcomes]!.swapAt(0, 1)
        for index in topics.records[.outcomes]!.indices { topics.records[.outcomes]![index].offset = Int64(index) }
        let report = topics.audit()
        #expect(report.count(.orderViolations) == 1)
        #expect(report.examples[.orderViolations]?.first?.requestID == "r1")
        #expect(report.failures == 1)
    }

    @Test("sequence gaps and repeats; a grant no outcome explains; a changelog record that disagrees")
    func changes() {
        var topics = Self.clean()
        let repeated = topics.records[.changes]![0].value
        topics.append(.changes, repeated, key: "app:u1")
        // Sequence 3 (2 is missing): a grant for the cancelled r2.
        let unexplained = EntitlementChangeEvent(
            appID: "app", appUserID: "u1", change: .granted, entitlement: Self.trial, status: .verified,
            isActive: true, effectiveAtMs: 1200, sequence: 3, requestID: "r2")
        topics.append(.changes, unexplained.jsonBytes(), key: "app:u1")
        let report = topics.audit()
        #expect(report.count(.sequenceRepeats) == 1)
        #expect(report.count(.sequenceGaps) == 1)
        #expect(report.count(.unexplainedChanges) == 1)
        #expect(report.examples[.unexplainedChanges]?.first?.requestID == "r2")
        // The changelog stayed at sequence 1.
        #expect(report.count(.stateMismatches) == 1)
        #expect(report.failures == 4, "\(report.table())")

        var disagreeing = Self.clean()
        var state = try! EntitlementStateRecord(jsonBytes: disagreeing.records[.state]![0].value)
        state.grants[0].isActive = false
        disagreeing.append(.state, state.jsonBytes(), key: state.key)
        let mismatch = disagreeing.audit()
        #expect(mismatch.count(.stateMismatches) == 1)
        #expect(mismatch.examples[.stateMismatches]?.first?.user == "app:u1")
        #expect(mismatch.examples[.stateMismatches]?.first?.at.offset == 1)
        #expect(mismatch.failures == 1)
    }

    @Test("the range selects requests by record timestamp; answers to requests outside it are not orphans")
    func range() {
        let report = Self.clean().audit(PipelineAudit.Range(fromMs: 1001, toMs: 1002))
        #expect(report.figures.requests == 1)
        #expect(report.figures.outcomes == 1)
        #expect(report.count(.invalidRequests) == 0)
        #expect(report.failures == 0, "\(report.table())")
    }

    @Test("after retention deleted early requests, outcomes older than what is held are not orphans")
    func retention() {
        var topics = Self.clean()
        for index in topics.records[.requests]!.indices { topics.records[.requests]![index].offset += 10 }
        for index in topics.records[.deadLetters]!.indices {
            var letter = try! DeadLetterEvent(jsonBytes: topics.records[.deadLetters]![index].value)
            letter.originalOffset += 10
            topics.records[.deadLetters]![index].value = letter.jsonBytes()
        }
        for (id, requestedAt) in [("deleted", Int64(999)), ("ghost", 1001)] {
            var request = Self.request(id)
            request.requestedAtMs = requestedAt
            topics.append(
                .outcomes,
                PurchaseOutcomeEvent(request: request, result: .cancelled, attempts: 1, completedAtMs: 1400)
                    .jsonBytes())
        }
        let report = topics.audit()
        #expect(report.figures.requestsHeldFromMs == 1000)
        #expect(report.count(.orphanOutcomes) == 1)
        #expect(report.examples[.orphanOutcomes]?.first?.requestID == "ghost")
        #expect(report.failures == 1, "\(report.table())")
    }

    @Test("the JSON names every discrepancy with an integer count; the HTML is one page with every chart")
    func rendering() throws {
        var topics = Self.clean()
        let late = Self.request("r<4>&", user: "u3")
        topics.append(.requests, late.jsonBytes(), key: late.key, at: 1004)
        let report = topics.audit()
        guard case .object(let fields) = try JSONValue.parse(Array(report.json().utf8)) else {
            Issue.record("not an object")
            return
        }
        for discrepancy in AuditReport.Discrepancy.allCases {
            guard case .integer(let count)? = fields[discrepancy.rawValue] else {
                Issue.record("\(discrepancy.rawValue) missing")
                continue
            }
            #expect(Int(count) == report.count(discrepancy))
        }
        let html = report.html()
        #expect(html.hasPrefix("<!DOCTYPE html>"))
        for id in AuditReport.chartIDs { #expect(html.contains("<svg id=\"\(id)\"")) }
        #expect(html.contains("r&lt;4&gt;&amp;"))
        #expect(!html.contains("src=") && !html.contains("href="), "no external assets")
    }
}
