import EncoreEvents
import Foundation

/// Per-user entitlement state: Encore grants from purchase outcomes, the states other sources
/// report, and the access rules merging them. Pure: time is passed in, so it is replayable.
///
/// Rules: `purchased` grants `verified`, `pending` grants `provisional` and a later `purchased`
/// for the same product (or request) verifies it; `cancelled`, `failed` and `not_attempted` never
/// grant nor revoke. A free trial expires `value` days or months after it was granted (verified);
/// discounts and credits do not expire. Only observable changes give events; `sequence` counts
/// every change of the user.
public struct EntitlementLedger: Sendable {
    struct UserEntry: Sendable {
        var state: EntitlementStateRecord
        var partition: Int32
        /// When this user's entry in `expiries` is due; other entries of the user there are stale.
        var scheduledAtMs: Int64? = nil
    }

    public let catalog: EntitlementCatalog
    public let journal: JournalPolicy
    /// (`users` and its `UserEntry`, `journals` and `legacySettled` are not private: the journal's
    /// extension, `Journal/EntitlementLedger+Journal.swift`, reads and changes them, and `complete`
    /// here calls its `journalRecord` and `journalUpdate`.)
    var users: [String: UserEntry] = [:]
    /// The request journal's memory, per requests partition.
    var journals: [Int32: RequestMemory] = [:]
    /// Requests of an earlier version's journal (in their user's state) that journal records now
    /// supersede, by user: taken out of the state once the request's result is durable
    /// (``dropLegacyEntry(userKey:requestID:)``), so that a restart never reads the older entry back
    /// after the newer record's slot is reused.
    var legacySettled: [String: Set<String>] = [:]
    /// Users whose state was restored with journal entries that newer records supersede: the
    /// state is written again without them (``takeLegacyCleanups()``).
    private var legacyCleanups: [String] = []
    /// Upcoming expiries (grants and source states), earliest first; at most one live entry per
    /// user (the one at its `scheduledAtMs`), so the queue grows with users, not with updates.
    private var expiries = TimerQueue<Int64, String>()
    /// When only some users are kept in memory: which, and where the others are read from.
    var resident: ResidentUsers? = nil
    /// The wall clock of the input being handled (a user read from the store is folded as a
    /// restore folds it: results past the retention at this time are left out).
    var nowMs: Int64 = 0

    public init(catalog: EntitlementCatalog, journal: JournalPolicy = JournalPolicy()) {
        self.catalog = catalog
        self.journal = journal
    }

    public var userCount: Int { users.count }

    /// The state of one user, if the ledger has any.
    public func state(ofUser key: String) -> EntitlementStateRecord? { users[key]?.state }

    /// Entries in the expiry queue (live and stale).
    var pendingExpiries: Int { expiries.count }

    /// The earliest time an expiry may be due, if any.
    public var nextExpiryMs: Int64? { expiries.firstDue }

    // MARK: Restore and hand-over

    /// Takes a user's state read back from the changelog (the latest record of the key wins).
    /// Entries the state keeps in its journal (an earlier version's) are remembered under the
    /// journal records restored first (``restore(journal:partition:)``), which are newer.
    public mutating func restore(_ state: EntitlementStateRecord, partition: Int32, nowMs: Int64? = nil) {
        let key = state.key
        users[key] = UserEntry(state: state, partition: partition)
        schedule(key)
        guard !state.journal.isEmpty else { return }
        let horizon = nowMs.map { $0 - journal.retentionMs } ?? .min
        let superseded = withJournal(partition) { memory in
            state.journal.entries.filter { entry in
                (entry.result == nil || entry.lastTouchedMs >= horizon) && !memory.recordLegacy(userKey: key, entry)
            }
        }
        guard !superseded.isEmpty else { return }
        // Their journal records are durable (read back): the state may drop them at once.
        for entry in superseded { users[key]?.state.journal.remove(requestID: entry.requestID) }
        legacyCleanups.append(key)
    }

    /// The state updates that write restored users' states without the earlier version's entries
    /// that newer journal records supersede.
    public mutating func takeLegacyCleanups() -> [LedgerUpdate] {
        defer { legacyCleanups.removeAll() }
        return legacyCleanups.compactMap { key in
            users[key].map { LedgerUpdate(changes: [], state: $0.state, partition: $0.partition, key: key) }
        }
    }

    /// Whether a journal record settled a request of an earlier version's journal.
    public var hasLegacySettled: Bool { !legacySettled.isEmpty }

    /// The request's journal record is durable: its earlier version's entry leaves the user's state,
    /// written again (`nil`: the state holds no such entry).
    public mutating func dropLegacyEntry(userKey key: String, requestID: String) -> LedgerUpdate? {
        guard legacySettled[key]?.remove(requestID) != nil else { return nil }
        if legacySettled[key]?.isEmpty == true { legacySettled[key] = nil }
        guard let index = users.index(forKey: key),
            users.values[index].state.journal.entry(requestID: requestID) != nil
        else { return nil }
        users.values[index].state.journal.remove(requestID: requestID)
        let entry = users.values[index]
        return LedgerUpdate(changes: [], state: entry.state, partition: entry.partition, key: key)
    }

    /// Takes a partition's request journal read back from the changelog.
    mutating func restore(journal memory: RequestMemory, partition: Int32) {
        journals[partition] = memory
    }

    /// Forgets the users of partitions this processor no longer owns.
    public mutating func remove(partitions: Set<Int32>) {
        users = users.filter { !partitions.contains($0.value.partition) }
        for partition in partitions { journals[partition] = nil }
        removeResidents(of: partitions)
    }

    /// Whether the user must stay in memory whatever the limit: an open request in its journal,
    /// an earlier version's journal in its state, or an expiry due soon.
    func mustStay(_ key: String, partition: Int32) -> Bool {
        if journals[partition]?.hasOpenRequest(ofUser: key) == true { return true }
        if legacySettled[key] != nil || legacyCleanups.contains(key) { return true }
        guard let entry = users[key] else { return false }
        if !entry.state.journal.isEmpty { return true }
        return entry.scheduledAtMs.map { $0 <= nowMs + Self.expiryPinMs } ?? false
    }

    /// Forgets a user kept in the store (it is read back when needed).
    mutating func forget(_ key: String, partition: Int32) {
        users[key] = nil  // (Its entry in the expiry queue goes stale: the store's index has it.)
        journals[partition]?.forget(userKey: key)
    }

    /// Rebuilds the expiry queue when most of its entries are stale (users let go, or scheduled
    /// again): it holds the users in memory, not every user ever read.
    mutating func dropStaleExpiries() {
        guard expiries.count > 1_024 && expiries.count > 2 * users.count else { return }
        var queue = TimerQueue<Int64, String>()
        for (key, entry) in users { if let due = entry.scheduledAtMs { queue.schedule(key, at: due) } }
        expiries = queue
    }

    /// Forgets journal entries past the retention at `nowMs`.
    public mutating func pruneJournals(nowMs: Int64) {
        let horizon = nowMs - journal.retentionMs
        for partition in Array(journals.keys) { journals[partition]?.prune(untouchedBefore: horizon) }
    }

    /// Requests the journal remembers, and about how many bytes each takes.
    public var journalFigures: (requests: Int, bytesPerRequest: Double) {
        let count = journals.values.reduce(0) { $0 + $1.count }
        guard count > 0 else { return (0, 0) }
        let bytes = journals.values.reduce(0.0) { $0 + $1.bytesPerRequest * Double($1.count) }
        return (count, bytes / Double(count))
    }

    /// The lane of user `appID`:`appUserID` of requests partition `partition`, with its key's
    /// storage shared with what the journal's memory keeps (``RequestMemory/canonical(_:)``).
    /// (Mutating only to read the memory in place, ``inPlace(_:_:)``: a getter copies it whole.)
    mutating func lane(appID: String, appUserID: String, partition: Int32) -> UserLane {
        let lane = UserLane(appID: appID, appUserID: appUserID)
        guard let index = journals.index(forKey: partition) else { return lane }
        return inPlace(&journals.values[index]) { $0.canonical(lane) }
    }

    mutating func withJournal<R>(_ partition: Int32, _ body: (inout RequestMemory) -> R) -> R {
        let cap = journal.perUserCap
        return body(&journals[partition, default: RequestMemory(cap: cap)])
    }

    // MARK: Results

    /// Records a request's outcome: its result in the journal and, with `grants`, what it grants
    /// (rules above).
    public mutating func complete(
        _ outcome: PurchaseOutcomeEvent, entitlement offered: Entitlement?, campaignID: String? = nil,
        offerID: String? = nil, partition: Int32, grants: Bool = true
    ) -> LedgerUpdate {
        complete(
            outcome, entitlement: offered, campaignID: campaignID, offerID: offerID, partition: partition,
            grants: grants, known: nil, holdsState: true)
    }

    /// `known`: the outcome's user key and journal key, when the caller already has them (`nil`: built
    /// here); `holdsState`: whether an update of the journal alone carries the user's whole state
    /// (``LedgerUpdate/holdsState``).
    mutating func complete(
        _ outcome: PurchaseOutcomeEvent, entitlement offered: Entitlement?, campaignID: String?, offerID: String?,
        partition: Int32, grants: Bool, known: JournalIdentity?, holdsState: Bool
    ) -> LedgerUpdate {
        let status: EntitlementStatus? =
            switch outcome.result {
            case .purchased: .verified
            case .pending: .provisional
            case .cancelled, .failed, .notAttempted: nil
            }
        let entitlement = grants && status != nil ? offered ?? catalog.entitlement(for: outcome.productID) : nil
        let now = outcome.completedAtMs
        let key = known?.userKey ?? outcome.key
        load(key, partition: partition)
        var update: LedgerUpdate? = nil
        if let status, let entitlement, !isSameGrantAgain(outcome, entitlement, status: status, key: key) {
            update = mutate(key, outcome.appID, outcome.appUserID, partition: partition, nowMs: now) {
                state, changes in
                Self.grant(
                    outcome, entitlement, status: status, campaignID: campaignID, offerID: offerID, to: &state,
                    changes: &changes)
            }
        }
        let record = journalRecord(
            userKey: key, appID: outcome.appID, appUserID: outcome.appUserID, requestID: outcome.requestID,
            partition: partition, known: known
        ) { earlier in
            // A failure journaled before its outcome stays as it was (it rebuilds the outcome).
            if let earlier, earlier.result != nil, earlier.error != nil { return earlier }
            return .init(
                requestID: outcome.requestID, attempts: outcome.attempts, startedAtMs: earlier?.startedAtMs ?? now,
                result: outcome.result, completedAtMs: now, offset: earlier?.offset,
                inDoubtSinceMs: earlier?.inDoubtSinceMs, digest: earlier?.digest)
        }
        // (Moved out of the optional and changed in place: `update ?? ...` copied it whole.)
        guard var changed = update.take() else {
            return journalUpdate(
                key: key, appID: outcome.appID, appUserID: outcome.appUserID, partition: partition, record,
                holdsState: holdsState)
        }
        changed.journal = record
        return changed
    }

    // MARK: Rules

    /// The common case of a repeat purchase: the same grant is active (as strong), and nothing of
    /// the user is due to expire, so the state cannot change and nothing needs building.
    private func isSameGrantAgain(
        _ outcome: PurchaseOutcomeEvent, _ entitlement: Entitlement, status: EntitlementStatus, key: String
    ) -> Bool {
        guard let held = users[key]?.state else { return false }
        let now = outcome.completedAtMs
        return held.grants.contains {
            $0.isActive && $0.productID == outcome.productID && $0.entitlement == entitlement
                && ($0.status == .verified || status == .provisional)
        } && !held.grants.contains { $0.isActive && ($0.expiresAtMs.map { $0 <= now } ?? false) }
    }

    /// What `outcome` grants, applied to `state` (a pending or completed purchase).
    private static func grant(
        _ outcome: PurchaseOutcomeEvent, _ entitlement: Entitlement, status: EntitlementStatus, campaignID: String?,
        offerID: String?, to state: inout EntitlementStateRecord, changes: inout [EntitlementChangeEvent]
    ) {
        let now = outcome.completedAtMs
        let grant = EntitlementStateRecord.Grant(
            productID: outcome.productID, entitlement: entitlement, status: status, isActive: true,
            grantedAtMs: now, expiresAtMs: Self.expiry(of: entitlement, from: now), requestID: outcome.requestID,
            campaignID: campaignID, offerID: offerID)
        let existing = state.grants.firstIndex {
            $0.isActive && ($0.productID == outcome.productID || $0.requestID == outcome.requestID)
        }
        if let index = existing {
            let current = state.grants[index]
            if current.status == .provisional && status == .verified {
                state.grants[index] = grant
                changes.append(Self.change(.verified, grant, state: state, at: now))
            } else if current.entitlement != entitlement {
                // A different offer for the product replaces the grant, keeping the stronger status.
                var replacement = grant
                if current.status == .verified { replacement.status = .verified }
                state.grants[index] = replacement
                changes.append(Self.change(.granted, replacement, state: state, at: now))
            }
            // Otherwise: the same grant again, nothing to observe.
        } else {
            // One grant per product: an expired one is replaced.
            state.grants.removeAll { $0.productID == outcome.productID }
            state.grants.append(grant)
            changes.append(Self.change(.granted, grant, state: state, at: now))
        }
    }

    /// Applies a state reported by another source. `nil` when it is older than what the ledger
    /// holds for the same source and entitlement (or the same event again).
    public mutating func apply(source event: EntitlementSourceEvent, partition: Int32, nowMs: Int64) -> LedgerUpdate? {
        let key = event.key
        load(key, partition: partition)
        if let held = users[key]?.state.sources.first(where: {
            $0.source == event.source && $0.entitlementID == event.entitlementID
        }) {
            let isNewer =
                event.occurredAtMs > held.occurredAtMs
                || (event.occurredAtMs == held.occurredAtMs && event.eventID > held.eventID)
            guard isNewer else { return nil }
        }
        return mutate(key, event.appID, event.appUserID, partition: partition, nowMs: nowMs) { state, _ in
            state.sources.removeAll { $0.source == event.source && $0.entitlementID == event.entitlementID }
            state.sources.append(EntitlementStateRecord.Source(event))
        }
    }

    /// Emits what expired by `nowMs`: grants whose time passed, and access answers that flip
    /// because a grant or a source state expired. Once per expiry: the state records it.
    public mutating func expire(nowMs: Int64) -> [LedgerUpdate] {
        let due = Set(expiries.popDue(now: nowMs))
        return due.sorted().compactMap { key in
            // Entries of forgotten users, or superseded by a later schedule, are stale.
            guard let entry = users[key], let scheduled = entry.scheduledAtMs, scheduled <= nowMs else { return nil }
            users[key]?.scheduledAtMs = nil
            defer { schedule(key, after: nowMs) }
            if let update = mutate(
                key, entry.state.appID, entry.state.appUserID, partition: entry.partition, nowMs: nowMs, { _, _ in })
            {
                return update
            }
            // Nothing changed (a source state ran out with no rule's answer turning). With users
            // kept in the store, the state is written all the same, its update time moved on:
            // the store's expiry index, computed from the state, then holds the next expiry, not
            // this one, which its cursor has passed.
            guard resident != nil,
                Self.earliestExpiry(of: entry.state, after: nowMs) != Self.earliestExpiry(of: entry.state, after: .min)
            else { return nil }
            users[key]?.state.updatedAtMs = max(entry.state.updatedAtMs, nowMs)
            return LedgerUpdate(changes: [], state: users[key]!.state, partition: entry.partition, key: key)
        }
    }

    // MARK: Internals

    /// Runs `body` on the user's state after settling expiries due at `nowMs`, re-evaluates the
    /// access rules, and returns the update when the state changed.
    private mutating func mutate(
        _ key: String, _ appID: String, _ appUserID: String, partition: Int32, nowMs: Int64,
        _ body: (inout EntitlementStateRecord, inout [EntitlementChangeEvent]) -> Void
    ) -> LedgerUpdate? {
        let index = users.index(forKey: key)
        var state = EntitlementStateRecord(appID: appID, appUserID: appUserID)
        // Taken out of the table while it changes, so that the table's copy does not make the
        // grants copy themselves.
        if let index { swap(&state, &users.values[index].state) }
        let before = (
            grants: state.grants, sources: state.sources, access: state.access, updatedAtMs: state.updatedAtMs
        )
        var changes: [EntitlementChangeEvent] = []
        for index in state.grants.indices {
            guard state.grants[index].isActive, let expiresAt = state.grants[index].expiresAtMs, expiresAt <= nowMs
            else { continue }
            state.grants[index].isActive = false
            changes.append(Self.change(.expired, state.grants[index], state: state, at: expiresAt))
        }
        let grantsExpired = !changes.isEmpty
        body(&state, &changes)
        let answers = accessAnswers(state, nowMs: nowMs)
        for rule in catalog.accessRules {
            let answer = answers[rule.name] ?? (false, [])
            guard answer.active != (state.access[rule.name] ?? false) else { continue }
            state.access[rule.name] = answer.active
            // Inactive because something expired rather than because a source said so.
            let expired =
                grantsExpired || sourceExpired(rule, sources: before.sources, since: before.updatedAtMs, nowMs: nowMs)
            changes.append(
                EntitlementChangeEvent(
                    appID: appID, appUserID: appUserID,
                    change: answer.active ? .granted : expired ? .expired : .revoked,
                    entitlement: nil, status: nil, access: rule.name, isActive: answer.active, effectiveAtMs: nowMs,
                    sequence: 0, sources: answer.sources))
        }
        // Rules no longer configured are forgotten.
        if state.access.contains(where: { name, _ in !catalog.accessRules.contains { $0.name == name } }) {
            state.access = state.access.filter { name, _ in catalog.accessRules.contains { $0.name == name } }
        }
        guard state.grants != before.grants || state.sources != before.sources || state.access != before.access
        else {
            if let index { swap(&state, &users.values[index].state) }
            return nil
        }
        for index in changes.indices {
            state.sequence += 1
            changes[index].sequence = state.sequence
        }
        state.updatedAtMs = max(state.updatedAtMs, nowMs)
        // An earlier version's journal in the state, rewritten with it until its entries age out.
        if !state.journal.isEmpty { journal.prune(&state.journal, nowMs: nowMs) }
        if let index {
            users.values[index].state = state
            users.values[index].partition = partition
        } else {
            users[key] = UserEntry(state: state, partition: partition)
        }
        schedule(key)
        return LedgerUpdate(changes: changes, state: state, partition: partition, key: key)
    }

    /// Whether one of the rule's source states (before this update) reached its expiry since the
    /// last update.
    private func sourceExpired(
        _ rule: AccessRule, sources: [EntitlementStateRecord.Source], since updatedAtMs: Int64, nowMs: Int64
    ) -> Bool {
        sources.contains { source in
            guard source.isActive, let expiresAt = source.expiresAtMs,
                expiresAt > updatedAtMs, expiresAt <= nowMs
            else { return false }
            return rule.terms.contains { term in
                guard case .source(let name, let id) = term else { return false }
                return name == source.source && (id == nil || id == source.entitlementID)
            }
        }
    }

    private func accessAnswers(
        _ state: EntitlementStateRecord, nowMs: Int64
    ) -> [String: (active: Bool, sources: [EntitlementChangeEvent.SourceState])] {
        var answers: [String: (Bool, [EntitlementChangeEvent.SourceState])] = [:]
        for rule in catalog.accessRules {
            var sources: [EntitlementChangeEvent.SourceState] = []
            for term in rule.terms {
                switch term {
                case .encore(let type, let verifiedOnly):
                    let grants = state.grants.filter {
                        $0.isActive && (type == nil || $0.entitlement.type == type)
                            && (!verifiedOnly || $0.status == .verified)
                    }
                    sources.append(
                        .init(
                            source: "encore", isActive: !grants.isEmpty, entitlementID: type?.rawValue ?? "*",
                            expiresAtMs: grants.compactMap(\.expiresAtMs).max()))
                case .source(let name, let id):
                    let matching = state.sources.filter {
                        $0.source == name && (id == nil || $0.entitlementID == id)
                    }
                    let active = matching.filter { $0.isActive && ($0.expiresAtMs.map { $0 > nowMs } ?? true) }
                    sources.append(
                        .init(
                            source: name, isActive: !active.isEmpty, entitlementID: id ?? "*",
                            expiresAtMs: active.compactMap(\.expiresAtMs).max()))
                }
            }
            answers[rule.name] = (sources.contains { $0.isActive }, sources)
        }
        return answers
    }

    /// Queues the user's earliest upcoming expiry; source states that ran out by `floor` (or before
    /// the last update) were settled already.
    private mutating func schedule(_ key: String, after floor: Int64 = .min) {
        guard let index = users.index(forKey: key) else { return }
        let earliest = Self.earliestExpiry(of: users.values[index].state, after: floor)
        guard earliest != users.values[index].scheduledAtMs else { return }
        users.values[index].scheduledAtMs = earliest
        if let earliest { expiries.schedule(key, at: earliest) }
    }

    /// When the state's earliest expiry is due: an active grant's (past its time, it expires at
    /// the next settle), or an active source state's after `floor` and the last update. Only the
    /// earliest is queued: settling it queues the next. The state store's index reads the same rule
    /// from a record's JSON without decoding it (`ChangelogIndexSummary.state`, kept equal by its tests).
    static func earliestExpiry(of state: EntitlementStateRecord, after floor: Int64) -> Int64? {
        var earliest: Int64? = nil
        for grant in state.grants where grant.isActive {
            if let expiry = grant.expiresAtMs { earliest = min(earliest ?? expiry, expiry) }
        }
        let since = max(state.updatedAtMs, floor)
        for source in state.sources where source.isActive {
            if let expiry = source.expiresAtMs, expiry > since { earliest = min(earliest ?? expiry, expiry) }
        }
        return earliest
    }

    private static func change(
        _ kind: EntitlementChangeKind, _ grant: EntitlementStateRecord.Grant, state: EntitlementStateRecord,
        at effectiveAtMs: Int64
    ) -> EntitlementChangeEvent {
        EntitlementChangeEvent(
            appID: state.appID, appUserID: state.appUserID, change: kind, entitlement: grant.entitlement,
            status: grant.status, isActive: grant.isActive, effectiveAtMs: effectiveAtMs, sequence: 0,
            expiresAtMs: grant.expiresAtMs, requestID: grant.requestID, campaignID: grant.campaignID,
            offerID: grant.offerID)
    }

    /// When a grant made at `fromMs` ends: free trials last `value` days or calendar months (UTC).
    static func expiry(of entitlement: Entitlement, from fromMs: Int64) -> Int64? {
        guard entitlement.type == .freeTrial else { return nil }
        let day = 86_400_000.0
        switch entitlement.unit {
        case .days:
            return fromMs + Int64((entitlement.value * day).rounded())
        case .months:
            let whole = Int(entitlement.value.rounded(.down))
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(identifier: "UTC")!
            let start = Date(timeIntervalSince1970: Double(fromMs) / 1000)
            let end = calendar.date(byAdding: .month, value: whole, to: start) ?? start
            let fraction = (entitlement.value - Double(whole)) * 30 * day
            return Int64((end.timeIntervalSince1970 * 1000).rounded()) + Int64(fraction.rounded())
        case .percent, .dollars:
            // A trial measured in percent or dollars has no duration: it does not expire.
            return nil
        }
    }
}
