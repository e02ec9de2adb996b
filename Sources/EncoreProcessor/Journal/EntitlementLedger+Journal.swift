import EncoreEvents

/// The request journal in the ledger: intents, failures, in-doubt and results of requests, each a
/// small journal record of its own (``JournalRecord``). A result is recorded with what it grants
/// (``complete(_:entitlement:campaignID:offerID:partition:grants:)``, beside the rules).
extension EntitlementLedger {
    /// The journal's latest entry for `requestID` of user `key`: an intent (no result) or a result.
    public mutating func journalEntry(
        ofUser key: String, requestID: String, partition: Int32? = nil
    ) -> EntitlementStateRecord.RequestEntry? {
        journalEntry(ofUser: key, requestID: requestID, partition: partition, requestKey: nil)
    }

    /// `requestKey`: the request's key in the journal, when the caller already has it (`nil`: built here).
    mutating func journalEntry(
        ofUser key: String, requestID: String, partition: Int32?, requestKey: RequestMemory.Key?
    ) -> EntitlementStateRecord.RequestEntry? {
        if let partition { load(key, partition: partition) }
        let requestKey = requestKey ?? RequestMemory.Key(userKey: key, requestID: requestID)
        if let partition {
            // (Read in place, ``inPlace(_:_:)``: a getter copies the whole memory.)
            guard let index = journals.index(forKey: partition) else { return nil }
            return inPlace(&journals.values[index]) { $0.entry(requestKey, requestID: requestID) }
        }
        for memory in journals.values {
            if let entry = memory.entry(requestKey, requestID: requestID) { return entry }
        }
        return nil
    }

    /// Records that call `attempt` of `request` is about to start: the intent, which must be
    /// durable before the call is made. It keeps what the request's entry knew (in doubt since,
    /// the record's offset, the content digest).
    public mutating func recordIntent(
        _ request: PurchaseRequestEvent, attempt: Int, partition: Int32, nowMs: Int64, offset: Int64? = nil,
        digest: String? = nil
    ) -> LedgerUpdate {
        recordIntent(
            request, attempt: attempt, partition: partition, nowMs: nowMs, offset: offset, digest: digest,
            known: nil, holdsState: true)
    }

    /// `known`: the request's user key and journal key, when the caller already has them (`nil`: built
    /// here); `holdsState`: whether the update carries the user's whole state (``LedgerUpdate/holdsState``).
    mutating func recordIntent(
        _ request: PurchaseRequestEvent, attempt: Int, partition: Int32, nowMs: Int64, offset: Int64?,
        digest: String?, known: JournalIdentity?, holdsState: Bool
    ) -> LedgerUpdate {
        // (The closure captures the id alone: capturing the request copied it whole.)
        let requestID = request.requestID
        return replaceEntry(of: request, partition: partition, known: known, holdsState: holdsState) { earlier in
            .init(
                requestID: requestID, attempts: attempt, startedAtMs: nowMs, offset: offset ?? earlier?.offset,
                inDoubtSinceMs: earlier?.inDoubtSinceMs, digest: digest ?? earlier?.digest)
        }
    }

    /// Records that `request` went in doubt after `attempts` calls: its intent stays open (a
    /// restart reconciles it), marked with the time, and nothing is granted.
    public mutating func recordInDoubt(
        _ request: PurchaseRequestEvent, attempts: Int, partition: Int32, nowMs: Int64
    ) -> LedgerUpdate {
        replaceEntry(of: request, partition: partition) { earlier in
            .init(
                requestID: request.requestID, attempts: attempts, startedAtMs: earlier?.startedAtMs ?? nowMs,
                offset: earlier?.offset, inDoubtSinceMs: nowMs, digest: earlier?.digest)
        }
    }

    /// Records a failure the processor decided, before its outcome is published: with what
    /// rebuilds that outcome (error, controller, the record's offset), so that a restart reading
    /// the record again publishes the same outcome instead of calling billing again. `result`
    /// `pending`: an in-doubt request that expired (its outcome stays `pending`).
    public mutating func recordFailure(
        _ request: PurchaseRequestEvent, attempts: Int, error: PurchaseOutcomeEvent.Failure, controller: String?,
        offset: Int64, partition: Int32, nowMs: Int64, result: OutcomeResult = .failed
    ) -> LedgerUpdate {
        replaceEntry(of: request, partition: partition) { earlier in
            .init(
                requestID: request.requestID, attempts: attempts, startedAtMs: earlier?.startedAtMs ?? nowMs,
                result: result, completedAtMs: nowMs, error: error, controller: controller, offset: offset,
                inDoubtSinceMs: earlier?.inDoubtSinceMs, digest: earlier?.digest)
        }
    }

    /// Replaces the journal entry of `request` with `entry(earlier entry)`: the journal record
    /// to write, under the request's slot (a new one for a request not journaled yet).
    private mutating func replaceEntry(
        of request: PurchaseRequestEvent, partition: Int32, known: JournalIdentity? = nil, holdsState: Bool = true,
        _ entry: (EntitlementStateRecord.RequestEntry?) -> EntitlementStateRecord.RequestEntry
    ) -> LedgerUpdate {
        let key = known?.userKey ?? request.key
        load(key, partition: partition)
        let record = journalRecord(
            userKey: key, appID: request.appID, appUserID: request.appUserID, requestID: request.requestID,
            partition: partition, known: known, entry)
        return journalUpdate(
            key: key, appID: request.appID, appUserID: request.appUserID, partition: partition, record,
            holdsState: holdsState)
    }

    /// An update of the journal alone: `journal`, with the user's state when `holdsState` (a copy
    /// of it), or with the user's identity only.
    func journalUpdate(
        key: String, appID: String, appUserID: String, partition: Int32, _ journal: consuming JournalRecord,
        holdsState: Bool
    ) -> LedgerUpdate {
        let index = holdsState ? users.index(forKey: key) : nil
        return LedgerUpdate(
            changes: [],
            state: index.map { users.values[$0].state } ?? EntitlementStateRecord(appID: appID, appUserID: appUserID),
            partition: partition, key: key, writesState: false, journal: journal, holdsState: holdsState)
    }

    mutating func journalRecord(
        userKey key: String, appID: String, appUserID: String, requestID: String, partition: Int32,
        known: JournalIdentity? = nil,
        _ entry: (EntitlementStateRecord.RequestEntry?) -> EntitlementStateRecord.RequestEntry
    ) -> JournalRecord {
        let user = known?.user ?? UserLane(key: key)
        let (record, settlesLegacy) = withJournal(partition) { memory in
            let requestKey = known?.requestKey ?? RequestMemory.Key(userKey: key, requestID: requestID)
            let new = entry(memory.entry(requestKey, requestID: requestID))
            // (Its first journal record supersedes an earlier version's entry: a recovery's intent.)
            let settlesLegacy = memory.isLegacyOpen(requestKey)
            let seq = memory.seq(of: requestKey) ?? memory.allocate(user: user)
            memory.record(requestKey, user: user, seq: seq, new)
            return (JournalRecord(appID: appID, appUserID: appUserID, seq: seq, entry: new), settlesLegacy)
        }
        if settlesLegacy { legacySettled[key, default: []].insert(requestID) }
        return record
    }
}
