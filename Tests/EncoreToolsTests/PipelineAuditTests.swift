import EncoreEvents
import EncoreProcessor
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

        func audit(
            _ range: PipelineAudit.TimeRange = .init(), startedAtMs: Int64? = nil,
            watermarks: [PipelineAudit.Topic: [Int32: (low: Int64, high: Int64)]] = [:]
        ) -> AuditReport {
            var audit = PipelineAudit(range: range, topics: PipelineAuditTests.topics)
            for topic in PipelineAudit.Topic.allCases {
                if let startedAtMs {
                    audit.startReading(topic, nowMs: startedAtMs, watermarks: watermarks[topic] ?? [:])
                }
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

    @Test(
        "in doubt: a pending (outcome_unknown) then one final is no discrepancy and is counted; a final after a final, or a second final after the pending, is flagged"
    )
    func inDoubt() {
        var topics = Topics()
        let requests = (1...5).map { Self.request("d\($0)", user: "u\($0)") }
        for (index, event) in requests.enumerated() {
            topics.append(.requests, event.jsonBytes(), key: event.key, at: 1000 + Int64(index))
        }
        func outcome(_ request: PurchaseRequestEvent, _ result: OutcomeResult, reason: PendingReason? = nil) {
            topics.append(
                .outcomes,
                PurchaseOutcomeEvent(
                    request: request, result: result, attempts: 2, completedAtMs: 1500, pendingReason: reason
                ).jsonBytes(), key: request.key)
        }
        // d1: in doubt, then resolved. d2: in doubt, still open. d3: in doubt, expired (dead
        // letter). d4: in doubt, resolved, then a second final that contradicts it. d5: in doubt,
        // resolved by billing's own pending (deferred: final too).
        outcome(requests[0], .pending, reason: .outcomeUnknown)
        outcome(requests[1], .pending, reason: .outcomeUnknown)
        outcome(requests[2], .pending, reason: .outcomeUnknown)
        outcome(requests[3], .pending, reason: .outcomeUnknown)
        outcome(requests[4], .pending, reason: .outcomeUnknown)
        outcome(requests[0], .purchased)
        outcome(requests[4], .pending, reason: .deferred)
        outcome(requests[3], .cancelled)
        outcome(requests[3], .purchased)
        let expired = DeadLetterEvent(
            topic: "requests", partition: 0, offset: 2, key: nil, value: requests[2].jsonBytes(), headers: [],
            error: .init(
                stage: .controller, errorClass: "in_doubt_expired", message: "billing never answered", retryable: false),
            attempts: 40, failedAtMs: 2000, requestID: "d3")
        topics.append(.deadLetters, expired.jsonBytes())
        let report = topics.audit()
        #expect(report.figures.inDoubtOpened == 5)
        #expect(
            report.figures.inDoubtResolved == 3
                && report.figures.resolvedInDoubtByResult == ["purchased": 1, "cancelled": 1, "pending": 1])
        #expect(report.figures.inDoubtExpired == 1 && report.figures.inDoubtOpen == 1)
        #expect(
            report.count(.conflictingOutcomes) == 1 && report.examples[.conflictingOutcomes]?.first?.requestID == "d4")
        #expect(report.count(.missingOutcomes) == 0 && report.count(.duplicateOutcomes) == 0)
        #expect(report.failures == 1, "\(report.table())")
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
        let report = Self.clean().audit(PipelineAudit.TimeRange(fromMs: 1001, toMs: 1002))
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

    @Test(
        "a real ledger's history audits clean: pending then verified, a product's grant replaced, expiry, access flips, a rule dropped"
    )
    func ledgerHistory() throws {
        var catalog = EntitlementCatalog()
        catalog.add(try AccessRule.parse("pro = encore:freeTrial"))
        catalog.add(try AccessRule.parse("paid = encore:discount"))
        var ledger = EntitlementLedger(catalog: catalog)
        var topics = Topics()
        let day: Int64 = 86_400_000
        let trial = Entitlement(type: .freeTrial, value: 1, unit: .days)
        let discount = Entitlement(type: .discount, value: 50, unit: .percent)
        // (request, user, product, entitlement, result, at)
        let story: [(String, String, String, Entitlement, OutcomeResult, Int64)] = [
            ("a1", "u1", "pro", trial, .pending, 1000), ("a2", "u1", "pro", trial, .purchased, 2000),
            ("b1", "u2", "pro", trial, .purchased, 3000), ("b2", "u2", "pro", discount, .purchased, 4000),
            ("c1", "u3", "pro", trial, .cancelled, 5000),
        ]
        func record(_ update: LedgerUpdate) {
            for change in update.changes { topics.append(.changes, change.jsonBytes(), key: change.key) }
            topics.append(.state, update.state.jsonBytes(), key: update.state.key)
        }
        for (id, user, product, entitlement, result, at) in story {
            var request = Self.request(id, user: user)
            request.productID = product
            request.entitlement = entitlement
            topics.append(.requests, request.jsonBytes(), key: request.key, at: at)
            let outcome = PurchaseOutcomeEvent(request: request, result: result, attempts: 1, completedAtMs: at + 10)
            topics.append(.outcomes, outcome.jsonBytes(), key: outcome.key)
            record(ledger.complete(outcome, entitlement: entitlement, partition: 0))
        }
        // A day later the trials expire, and 'pro' flips back.
        for update in ledger.expire(nowMs: 2 * day) { record(update) }
        let expired = topics.records[.changes]!.compactMap { try? EntitlementChangeEvent(jsonBytes: $0.value) }
        #expect(expired.contains { $0.change == .expired && $0.access == nil })
        #expect(expired.contains { $0.access == "pro" && !$0.isActive })
        let report = topics.audit()
        #expect(report.failures == 0, "\(report.table())")

        // The catalog drops 'paid' (forgotten without a change), then u2 buys again.
        var reduced = EntitlementCatalog()
        reduced.add(try AccessRule.parse("pro = encore:freeTrial"))
        var later = EntitlementLedger(catalog: reduced)
        let held = try #require(topics.records[.state]!.last { $0.key == Array("app:u2".utf8) })
        later.restore(try EntitlementStateRecord(jsonBytes: held.value), partition: 0)
        #expect(try EntitlementStateRecord(jsonBytes: held.value).access["paid"] == true)
        var again = Self.request("b3", user: "u2")
        again.productID = "other"
        again.entitlement = trial
        topics.append(.requests, again.jsonBytes(), key: again.key, at: 3 * day)
        let outcome = PurchaseOutcomeEvent(request: again, result: .purchased, attempts: 1, completedAtMs: 3 * day + 10)
        topics.append(.outcomes, outcome.jsonBytes(), key: outcome.key)
        record(later.complete(outcome, entitlement: trial, partition: 0))
        let afterDrop = topics.audit()
        #expect(afterDrop.failures == 0, "\(afterDrop.table())")
    }

    @Test("a live pipeline: an outcome of a request produced after the requests were read is no orphan")
    func live() {
        var topics = Self.clean()
        for (id, completed) in [("before", Int64(1150)), ("after", 1250)] {
            topics.append(
                .outcomes,
                PurchaseOutcomeEvent(
                    request: Self.request(id), result: .cancelled, attempts: 1, completedAtMs: completed
                )
                .jsonBytes())
        }
        let report = topics.audit(startedAtMs: 1200)
        #expect(report.count(.orphanOutcomes) == 1)
        #expect(report.examples[.orphanOutcomes]?.first?.requestID == "before")
        // A partition emptied by retention: no outcome can be called an orphan.
        let emptied = topics.audit(startedAtMs: 1200, watermarks: [.requests: [5: (low: 7, high: 7)]])
        #expect(emptied.count(.orphanOutcomes) == 0 && emptied.figures.requestsHeldFromMs == .max)
    }

    @Test("after retention deleted early outcomes, older requests are not called missing")
    func outcomeRetention() {
        var topics = Self.clean()
        // r1's outcome is gone; the outcomes topic starts at offset 5, with a record of 1001.
        topics.records[.outcomes]!.removeFirst()
        for index in topics.records[.outcomes]!.indices {
            topics.records[.outcomes]![index].offset = Int64(index + 5)
            topics.records[.outcomes]![index].timestampMs = [1001, 1002][index]
        }
        let late = Self.request("r9", user: "u9")
        topics.append(.requests, late.jsonBytes(), key: late.key, at: 1005)
        let report = topics.audit()
        #expect(report.figures.outcomesHeldFromMs == 1001)
        // r1 (1000) may have lost its outcome to retention; r9 (1005) is missing.
        #expect(report.count(.missingOutcomes) == 1)
        #expect(report.examples[.missingOutcomes]?.first?.requestID == "r9")
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
