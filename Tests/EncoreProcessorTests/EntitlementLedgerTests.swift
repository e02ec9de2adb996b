import EncoreEvents
import Foundation
import Kafka
import Testing

@testable import EncoreProcessor

/// Builds outcomes and source events for one app at chosen times.
private enum Story {
    static let day: Int64 = 86_400_000
    static let start: Int64 = 1_767_225_600_000  // 2026-01-01T00:00:00Z
    static let trial = Entitlement(type: .freeTrial, value: 7, unit: .days)

    static func outcome(
        _ user: String, _ product: String, _ result: OutcomeResult, at ms: Int64, request: String? = nil
    ) -> PurchaseOutcomeEvent {
        PurchaseOutcomeEvent(
            requestID: request ?? "req-\(user)-\(product)-\(ms)", appID: "app", appUserID: user, productID: product,
            result: result, attempts: 1, store: .appStore, environment: .production, requestedAtMs: ms - 10,
            completedAtMs: ms)
    }

    static func source(
        _ user: String, _ source: String, _ id: String, active: Bool, at ms: Int64, expires: Int64? = nil
    ) -> EntitlementSourceEvent {
        EntitlementSourceEvent(
            appID: "app", appUserID: user, source: source, entitlementID: id, isActive: active, expiresAtMs: expires,
            eventID: "\(source)-\(ms)", occurredAtMs: ms)
    }

    static func ledger(rules: [String] = [], products: [String: Entitlement] = [:]) throws -> EntitlementLedger {
        var catalog = EntitlementCatalog()
        for (pattern, entitlement) in products { catalog.add(pattern, grants: entitlement) }
        for rule in rules { catalog.add(try AccessRule.parse(rule)) }
        return EntitlementLedger(catalog: catalog)
    }
}

/// `#require` for an expression that mutates (the macro cannot take one).
private func required<T>(_ value: T?, sourceLocation: SourceLocation = #_sourceLocation) throws -> T {
    try #require(value, sourceLocation: sourceLocation)
}

/// A compact view of a change for assertions: `kind target status active #sequence`.
private func summary(_ change: EntitlementChangeEvent) -> String {
    let target = change.access.map { "access:\($0)" } ?? change.entitlement.map { "\($0.type.rawValue)" } ?? "?"
    let status = change.status.map { " \($0.rawValue)" } ?? ""
    return "\(change.change.rawValue) \(target)\(status) \(change.isActive ? "active" : "inactive") #\(change.sequence)"
}

@Suite("Entitlement ledger")
struct EntitlementLedgerTests {
    @Test("purchased grants a verified trial that expires after its days; a repeat is a no-op")
    func purchasedTrial() throws {
        var ledger = try Story.ledger()
        let update = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                campaignID: "cmp", offerID: "offer", partition: 3))
        #expect(update.changes.map(summary) == ["granted freeTrial verified active #1"])
        let change = update.changes[0]
        #expect(change.expiresAtMs == Story.start + 7 * Story.day)
        #expect(change.effectiveAtMs == Story.start && change.campaignID == "cmp" && change.offerID == "offer")
        #expect(change.requestID == "req-u1-trial-\(Story.start)")
        #expect(update.partition == 3 && update.state.sequence == 1)
        // The same grant again: nothing observable, no state to write.
        #expect(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start + 5), entitlement: Story.trial,
                partition: 3) == nil)
    }

    @Test("pending grants provisional; purchased for the same product verifies it")
    func pendingThenPurchased() throws {
        var ledger = try Story.ledger()
        let pending = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .pending, at: Story.start), entitlement: Story.trial,
                partition: 0))
        #expect(pending.changes.map(summary) == ["granted freeTrial provisional active #1"])
        // Pending again: nothing new.
        #expect(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .pending, at: Story.start + 1), entitlement: Story.trial,
                partition: 0) == nil)
        let verified = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start + Story.day),
                entitlement: Story.trial, partition: 0))
        #expect(verified.changes.map(summary) == ["verified freeTrial verified active #2"])
        // The trial runs from the verification.
        #expect(verified.changes[0].expiresAtMs == Story.start + 8 * Story.day)
    }

    @Test("a purchased outcome for the pending request verifies it even under another product id")
    func verifiedBySameRequest() throws {
        var ledger = try Story.ledger()
        _ = ledger.applied(
            outcome: Story.outcome("u1", "trial", .pending, at: Story.start, request: "r1"), entitlement: Story.trial,
            partition: 0)
        let update = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial.v2", .purchased, at: Story.start + 1, request: "r1"),
                entitlement: Story.trial, partition: 0))
        #expect(update.changes.map(summary) == ["verified freeTrial verified active #2"])
    }

    @Test(
        "cancelled, failed and not_attempted never grant and never revoke",
        arguments: [
            OutcomeResult.cancelled, .failed, .notAttempted,
        ])
    func noGrant(_ result: OutcomeResult) throws {
        var ledger = try Story.ledger()
        #expect(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", result, at: Story.start), entitlement: Story.trial,
                partition: 0) == nil)
        _ = ledger.applied(
            outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial, partition: 0)
        #expect(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", result, at: Story.start + 1), entitlement: Story.trial,
                partition: 0) == nil)
        #expect(ledger.state(ofUser: "app:u1")?.grants.first?.isActive == true)
    }

    @Test("the catalog fills in the entitlement: exact ids first, then the longest prefix")
    func catalog() throws {
        let catalog = try EntitlementCatalog(
            jsonBytes: Array(
                """
                {"products": {"rc_*": {"type": "discount", "value": 20, "unit": "percent"},
                              "rc_trial_*": {"type": "freeTrial", "value": 1, "unit": "months"},
                              "rc_trial_special": {"type": "credit", "value": 5, "unit": "dollars"}},
                 "access_rules": {"pro": "revenuecat:pro | encore:freeTrial"}}
                """.utf8))
        #expect(catalog.entitlement(for: "rc_monthly") == Entitlement(type: .discount, value: 20, unit: .percent))
        #expect(catalog.entitlement(for: "rc_trial_x")?.type == .freeTrial)
        #expect(catalog.entitlement(for: "rc_trial_special")?.type == .credit)
        #expect(catalog.entitlement(for: "sk_monthly") == nil)
        #expect(catalog.accessRules.map(\.description) == ["pro = revenuecat:pro | encore:freeTrial"])

        var ledger = EntitlementLedger(catalog: catalog)
        let discount = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "rc_monthly", .purchased, at: Story.start), entitlement: nil, partition: 0)
        )
        // Discounts and credits carry their value and do not expire.
        #expect(discount.changes.first?.entitlement?.value == 20 && discount.changes.first?.expiresAtMs == nil)
        // The request's own entitlement wins over the catalog.
        let offered = try required(
            ledger.applied(
                outcome: Story.outcome("u2", "rc_monthly", .purchased, at: Story.start), entitlement: Story.trial,
                partition: 0))
        #expect(offered.changes.first?.entitlement == Story.trial)
        // Neither the request nor the catalog names an entitlement: nothing to grant.
        #expect(
            ledger.applied(
                outcome: Story.outcome("u3", "sk_x", .purchased, at: Story.start), entitlement: nil, partition: 0)
                == nil)
        // Months are calendar months (UTC).
        let month = try required(
            ledger.applied(
                outcome: Story.outcome("u4", "rc_trial_a", .purchased, at: Story.start), entitlement: nil, partition: 0)
        )
        #expect(month.changes.first?.expiresAtMs == Story.start + 31 * Story.day)
    }

    @Test("bad catalogs and access rules fail naming what is wrong")
    func badConfiguration() {
        func catalogError(_ text: String) -> String? {
            do {
                _ = try EntitlementCatalog(jsonBytes: Array(text.utf8))
                return nil
            } catch {
                return error.message
            }
        }
        #expect(
            catalogError("{\"products\": {\"p\": {\"type\": \"gift\", \"value\": 1, \"unit\": \"days\"}}}")?.contains(
                "products.p.type") == true)
        #expect(catalogError("{\"product\": {}}")?.contains("unknown key 'product'") == true)
        #expect(catalogError("[1]")?.contains("expected a JSON object") == true)
        #expect(
            catalogError("{\"access_rules\": {\"pro\": \"encore:gold\"}}")?.contains(
                "unknown Encore entitlement 'gold'") == true)
        for rule in ["pro", "= a:b", "pro = revenuecat", "pro = a:b | ", "p r o = a:b", "pro = rev cat:pro"] {
            #expect(throws: ProcessorError.self, "\(rule)") { try AccessRule.parse(rule) }
        }
        #expect(
            (try? AccessRule.parse("pro = revenuecat:* | encore:freeTrial@verified | encore:*"))?.terms == [
                .source("revenuecat", entitlementID: nil), .encore(.freeTrial, verifiedOnly: true),
                .encore(nil, verifiedOnly: false),
            ])
    }

    @Test("a trial expires once, when its time passes")
    func expiry() throws {
        var ledger = try Story.ledger()
        _ = ledger.applied(
            outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial, partition: 0)
        let expiresAt = Story.start + 7 * Story.day
        #expect(ledger.nextExpiryMs == expiresAt)
        #expect(ledger.expire(nowMs: expiresAt - 1).isEmpty)
        let updates = ledger.expire(nowMs: expiresAt + 500)
        #expect(updates.flatMap(\.changes).map(summary) == ["expired freeTrial verified inactive #2"])
        #expect(updates.first?.changes.first?.effectiveAtMs == expiresAt)
        #expect(ledger.expire(nowMs: expiresAt + 10_000).isEmpty)
        // After it expired, buying again grants anew.
        let again = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: expiresAt + 20_000), entitlement: Story.trial,
                partition: 0))
        #expect(again.changes.map(summary) == ["granted freeTrial verified active #3"])
    }

    /// A ledger keeping no user in memory but those that must stay, over a real store and writer.
    private struct Resident {
        let directory = StoreDirectory()
        let store: StateStore
        let writer: StateStoreWriter
        var ledger: EntitlementLedger
        var offset: Int64 = 0

        init(rules: [String]) throws {
            store = try StateStore(
                directory: directory.path, group: "g", stateTopic: "state", cacheBytes: 1 << 20,
                writeBufferBytes: 4 << 20,
                logger: Logger(label: "test"))
            writer = StateStoreWriter(
                store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
            writer.restored([0])
            ledger = try Story.ledger(rules: rules)
            ledger.keepResident(atMost: 0, source: writer)
            ledger.nowMs = Story.start
        }

        /// The update's records, acknowledged by the broker, as the producer hands them to the writer.
        mutating func written(_ update: LedgerUpdate) {
            var records: [KafkaProducerRecord] = []
            if update.writesState {
                records.append(
                    KafkaProducerRecord(
                        topic: "state", partition: update.partition, key: Array(update.key.utf8),
                        value: update.state.jsonBytes()))
            }
            if let journal = update.journal {
                records.append(
                    KafkaProducerRecord(
                        topic: "state", partition: update.partition, key: journal.key(slotCount: 100),
                        value: journal.jsonBytes()))
            }
            var deliveries: [KafkaDelivery] = []
            for record in records {
                deliveries.append(KafkaDelivery(token: 0, error: nil, record: record, offset: offset))
                offset += 1
            }
            writer.acknowledged(deliveries, worker: 0)
        }

        /// Two passes: the first takes the "used" mark, the second lets go.
        mutating func evict(pinned: Set<String> = []) {
            ledger.evict { pinned.contains($0) }
            ledger.evict { pinned.contains($0) }
        }

        func close() {
            writer.stop()
            directory.remove()
        }
    }

    @Test(
        "a user stays in memory while its records are not all in the store, it has an open request, its update is unacknowledged or its expiry is within a minute"
    )
    func whatMustStay() throws {
        var resident = try Resident(rules: ["pro = encore:freeTrial"])
        defer { resident.close() }
        resident.written(
            try required(
                resident.ledger.applied(
                    outcome: Story.outcome("written", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                    partition: 0)))
        resident.evict()
        #expect(resident.ledger.state(ofUser: "app:written") != nil, "acknowledged, not yet in the store")
        resident.writer.flush()
        resident.evict()
        #expect(resident.ledger.state(ofUser: "app:written") == nil, "in the store: let go")

        let request = PurchaseRequestEvent(
            requestID: "open-1", appID: "app", appUserID: "open", productID: "trial", store: .appStore,
            environment: .production, requestedAtMs: Story.start)
        resident.written(resident.ledger.recordIntent(request, attempt: 1, partition: 0, nowMs: Story.start))
        resident.written(
            try required(
                resident.ledger.applied(
                    outcome: Story.outcome("pinned", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                    partition: 0)))
        let soon = resident.ledger.apply(
            source: Story.source(
                "soon", "revenuecat", "pro", active: true, at: Story.start, expires: Story.start + 30_000),
            partition: 0, nowMs: Story.start)
        resident.written(try required(soon))
        resident.writer.flush()
        resident.evict(pinned: ["app:pinned"])
        #expect(resident.ledger.journalEntry(ofUser: "app:open", requestID: "open-1")?.result == nil)
        #expect(resident.ledger.residentFigures.loads == 4, "none of them read again")
        #expect(resident.ledger.state(ofUser: "app:pinned") != nil, "its update unacknowledged")
        #expect(resident.ledger.state(ofUser: "app:soon") != nil, "its expiry within a minute")
        #expect(resident.ledger.residentFigures.users == 3, "open, pinned and soon")
    }

    @Test(
        "with users in the store, an expiry that changes nothing still writes the state, so the store's expiry index moves on to the next one"
    )
    func expiryThatChangesNothing() throws {
        var resident = try Resident(rules: ["pro = encore:freeTrial"])
        defer { resident.close() }
        // A source state no rule reads ends first, the trial after.
        let trialEnds = Story.start + 7 * Story.day
        resident.written(
            try required(
                resident.ledger.applied(
                    outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                    partition: 0)))
        resident.written(
            try required(
                resident.ledger.apply(
                    source: Story.source(
                        "u1", "other", "x", active: true, at: Story.start, expires: Story.start + Story.day),
                    partition: 0, nowMs: Story.start)))
        resident.writer.flush()
        #expect(
            try resident.store.dueUsers(of: 0, after: nil, throughMs: Story.start + Story.day, limit: 5).users == [
                "app:u1"
            ])
        resident.ledger.nowMs = Story.start + Story.day + 1
        let updates = resident.ledger.expire(nowMs: Story.start + Story.day + 1)
        #expect(updates.count == 1 && updates[0].changes.isEmpty && updates[0].writesState)
        resident.written(updates[0])
        resident.writer.flush()
        #expect(try resident.store.dueUsers(of: 0, after: nil, throughMs: trialEnds - 1, limit: 5).users.isEmpty)
        #expect(try resident.store.dueUsers(of: 0, after: nil, throughMs: trialEnds, limit: 5).users == ["app:u1"])
    }

    @Test(
        "a user kept only in the store is read back for its expiry, from the store's index; the sequence goes on; a partition whose writes the store does not take keeps its users"
    )
    func expiryOfAUserLetGo() throws {
        let directory = StoreDirectory()
        defer { directory.remove() }
        let store = try StateStore(
            directory: directory.path, group: "g", stateTopic: "state", cacheBytes: 1 << 20, writeBufferBytes: 4 << 20,
            logger: Logger(label: "test"))
        let writer = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
        defer { writer.stop() }
        writer.restored([0])
        var ledger = try Story.ledger(rules: ["pro = encore:freeTrial"])
        ledger.keepResident(atMost: 0, source: writer)
        ledger.nowMs = Story.start
        var offset: Int64 = 0
        /// The update's records, acknowledged by the broker, as the producer hands them to the writer.
        func written(_ update: LedgerUpdate) {
            var records = [
                KafkaProducerRecord(
                    topic: "state", partition: update.partition, key: Array(update.key.utf8),
                    value: update.state.jsonBytes())
            ]
            if let journal = update.journal {
                records.append(
                    KafkaProducerRecord(
                        topic: "state", partition: update.partition, key: journal.key(slotCount: 100),
                        value: journal.jsonBytes()))
            }
            writer.acknowledged(
                records.map { record in
                    defer { offset += 1 }
                    return KafkaDelivery(token: 0, error: nil, record: record, offset: offset)
                }, worker: 0)
        }
        written(
            try required(
                ledger.applied(
                    outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                    partition: 0)))
        written(
            try required(
                ledger.applied(
                    outcome: Story.outcome("u2", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                    partition: 1)))
        writer.flush()
        // Two passes: the first takes the "used" mark, the second lets go (u2's partition 1 is not
        // restored in this process: the store does not take its records, so u2 stays).
        ledger.evict { _ in false }
        ledger.evict { _ in false }
        #expect(ledger.state(ofUser: "app:u1") == nil && ledger.state(ofUser: "app:u2") != nil)
        #expect(ledger.nextExpiryMs == Story.start + 7 * Story.day, "(u1's entry in the queue, stale, and u2's)")

        let expiresAt = Story.start + 7 * Story.day
        ledger.nowMs = expiresAt - 1
        ledger.loadDueUsers(of: [0])
        #expect(ledger.state(ofUser: "app:u1") == nil, "not due yet: not read")
        // (The index is read at most once a second.)
        ledger.nowMs = expiresAt + 1_000
        ledger.loadDueUsers(of: [0])
        let updates = ledger.expire(nowMs: expiresAt + 1_000)
        #expect(
            updates.filter { $0.key == "app:u1" }.flatMap(\.changes).map(summary) == [
                "expired freeTrial verified inactive #3", "revoked access:pro inactive #4",
            ]
                || updates.filter { $0.key == "app:u1" }.flatMap(\.changes).map(summary) == [
                    "expired freeTrial verified inactive #3", "expired access:pro inactive #4",
                ], "\(updates.flatMap(\.changes).map(summary))")
        #expect(updates.contains { $0.key == "app:u2" }, "the resident user expires as before")
        // Three reads: each user when its first outcome came (nothing in the store), u1 once again.
        #expect(ledger.residentFigures.loads == 3)
        // The index was read past u1: a second look reads nothing again.
        ledger.nowMs = expiresAt + 2_000
        ledger.loadDueUsers(of: [0])
        #expect(ledger.residentFigures.loads == 3)
    }

    @Test("an expiry that passed while the processor was down is emitted on restore, once; sequences continue")
    func expiryAcrossRestart() throws {
        var before = try Story.ledger(rules: ["pro = encore:freeTrial"])
        let granted = try required(
            before.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start), entitlement: Story.trial,
                partition: 2))
        #expect(
            granted.changes.map(summary) == ["granted freeTrial verified active #1", "granted access:pro active #2"])
        // Restart long after the expiry, from the state written to the changelog.
        var after = try Story.ledger(rules: ["pro = encore:freeTrial"])
        after.restore(granted.state, partition: 2)
        let now = Story.start + 30 * Story.day
        let updates = after.expire(nowMs: now)
        #expect(
            updates.flatMap(\.changes).map(summary) == [
                "expired freeTrial verified inactive #3", "expired access:pro inactive #4",
            ])
        #expect(updates.first?.partition == 2)
        // Restarting again from the state written after the expiry emits nothing.
        var third = try Story.ledger(rules: ["pro = encore:freeTrial"])
        third.restore(try #require(updates.last?.state), partition: 2)
        #expect(third.expire(nowMs: now + Story.day).isEmpty)
    }

    @Test("merged access: RevenueCat active then inactive while an Encore trial is still active")
    func mergedAccess() throws {
        var ledger = try Story.ledger(rules: ["pro = revenuecat:pro | superwall:active | encore:freeTrial"])
        let rcActive = try required(
            ledger.apply(
                source: Story.source("u1", "revenuecat", "pro", active: true, at: Story.start), partition: 0,
                nowMs: Story.start))
        #expect(rcActive.changes.map(summary) == ["granted access:pro active #1"])
        let sources = try #require(rcActive.changes.first?.sources)
        #expect(sources.map(\.source) == ["revenuecat", "superwall", "encore"])
        #expect(sources.map(\.isActive) == [true, false, false])
        // An Encore trial on top: the grant is a change, the access answer does not flip.
        let trial = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start + 1000), entitlement: Story.trial,
                partition: 0))
        #expect(trial.changes.map(summary) == ["granted freeTrial verified active #2"])
        // RevenueCat lapses: the trial still gives access, so no access change.
        let rcInactive = try required(
            ledger.apply(
                source: Story.source("u1", "revenuecat", "pro", active: false, at: Story.start + 2000), partition: 0,
                nowMs: Story.start + 2000))
        #expect(rcInactive.changes.isEmpty)
        // The trial ends: now access flips.
        let ended = ledger.expire(nowMs: Story.start + 8 * Story.day)
        #expect(
            ended.flatMap(\.changes).map(summary) == [
                "expired freeTrial verified inactive #3", "expired access:pro inactive #4",
            ])
    }

    @Test("a source saying inactive revokes access it alone gave")
    func revokedBySource() throws {
        var ledger = try Story.ledger(rules: ["pro = revenuecat:* | superwall:active"])
        _ = ledger.apply(
            source: Story.source("u1", "revenuecat", "gold", active: true, at: 10), partition: 0, nowMs: 10)
        let revoked = try required(
            ledger.apply(
                source: Story.source("u1", "revenuecat", "gold", active: false, at: 20), partition: 0, nowMs: 20))
        #expect(revoked.changes.map(summary) == ["revoked access:pro inactive #2"])
    }

    @Test("stale source events never overwrite newer state; the same event twice is a no-op")
    func staleSources() throws {
        var ledger = try Story.ledger(rules: ["pro = revenuecat:pro"])
        let newer = Story.source("u1", "revenuecat", "pro", active: false, at: 2000)
        let update = try required(ledger.apply(source: newer, partition: 0, nowMs: 3000))
        #expect(update.changes.isEmpty)  // inactive, as it already was: state only
        #expect(
            ledger.apply(
                source: Story.source("u1", "revenuecat", "pro", active: true, at: 1000), partition: 0, nowMs: 3000)
                == nil)
        #expect(ledger.apply(source: newer, partition: 0, nowMs: 3000) == nil)
        #expect(ledger.state(ofUser: "app:u1")?.sources.first?.isActive == false)
    }

    @Test("a source state that reaches its expires_at_ms ends the access it gave")
    func sourceExpiry() throws {
        var ledger = try Story.ledger(rules: ["pro = superwall:active"])
        _ = ledger.apply(
            source: Story.source("u1", "superwall", "active", active: true, at: 100, expires: 5000), partition: 0,
            nowMs: 100)
        #expect(ledger.nextExpiryMs == 5000)
        #expect(ledger.expire(nowMs: 4999).isEmpty)
        #expect(ledger.expire(nowMs: 5000).flatMap(\.changes).map(summary) == ["expired access:pro inactive #2"])
    }

    @Test("scope verified counts only verified grants; scope all counts provisional ones too")
    func scopes() throws {
        var ledger = try Story.ledger(rules: ["all = encore:*", "paid = encore:freeTrial@verified"])
        let pending = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .pending, at: Story.start), entitlement: Story.trial,
                partition: 0))
        #expect(
            pending.changes.map(summary) == ["granted freeTrial provisional active #1", "granted access:all active #2"])
        let purchased = try required(
            ledger.applied(
                outcome: Story.outcome("u1", "trial", .purchased, at: Story.start + 1), entitlement: Story.trial,
                partition: 0))
        #expect(
            purchased.changes.map(summary) == [
                "verified freeTrial verified active #3", "granted access:paid active #4",
            ])
    }

    @Test("users of revoked partitions are forgotten")
    func handOver() throws {
        var ledger = try Story.ledger()
        _ = ledger.applied(outcome: Story.outcome("u1", "t", .purchased, at: 1), entitlement: Story.trial, partition: 0)
        _ = ledger.applied(outcome: Story.outcome("u2", "t", .purchased, at: 1), entitlement: Story.trial, partition: 1)
        ledger.remove(partitions: [0])
        #expect(ledger.state(ofUser: "app:u1") == nil && ledger.state(ofUser: "app:u2") != nil)
        #expect(ledger.userCount == 1)
    }
}

@Suite("Entitlement ledger: expiry queue")
struct ExpiryQueueTests {
    @Test("updates of a user do not pile up in the expiry queue; a settled expiry is not repeated")
    func bounded() throws {
        var catalog = EntitlementCatalog()
        catalog.add(try AccessRule.parse("pro = revenuecat:pro | superwall:active"))
        var ledger = EntitlementLedger(catalog: catalog)
        // Many updates, all with the same upcoming expiry: one live entry.
        for index in 0..<1000 {
            _ = ledger.apply(
                source: EntitlementSourceEvent(
                    appID: "app", appUserID: "u1", source: "superwall", entitlementID: "active", isActive: true,
                    expiresAtMs: 50_000, eventID: "e\(index)", occurredAtMs: Int64(index)),
                partition: 0, nowMs: Int64(index))
        }
        #expect(ledger.pendingExpiries == 1)
        // RevenueCat keeps access: the superwall expiry flips nothing, and is settled once.
        _ = ledger.apply(
            source: EntitlementSourceEvent(
                appID: "app", appUserID: "u1", source: "revenuecat", entitlementID: "pro", isActive: true,
                eventID: "rc", occurredAtMs: 2000), partition: 0, nowMs: 2000)
        #expect(ledger.expire(nowMs: 60_000).isEmpty)
        #expect(ledger.nextExpiryMs == nil && ledger.pendingExpiries == 0)
        #expect(ledger.expire(nowMs: 70_000).isEmpty)
    }
}

extension EntitlementLedger {
    /// What the processor does with an outcome (``complete(_:entitlement:campaignID:offerID:partition:grants:)``),
    /// as the update that changes the user's state; `nil` when the state does not change.
    mutating func applied(
        outcome: PurchaseOutcomeEvent, entitlement: Entitlement?, campaignID: String? = nil, offerID: String? = nil,
        partition: Int32
    ) -> LedgerUpdate? {
        let update = complete(
            outcome, entitlement: entitlement, campaignID: campaignID, offerID: offerID, partition: partition)
        return update.writesState ? update : nil
    }
}
