import EncoreEvents

/// What a partition's changelog holds, read back in offset order: the latest state record of each
/// user, and the request journal's records folded into a memory (a later record of a slot
/// replaces the earlier one; entries past the retention are left out).
struct RestoredPartition: Sendable {
    var states: [String: EntitlementStateRecord] = [:]
    var journal: RequestMemory
    var journalRecords = 0
    /// The users read, when only some are (those with an open request: the others are read from
    /// the state store when needed); empty when every user of the partition is.
    var users: [String] = []

    init(journalCap: Int) {
        journal = RequestMemory(cap: journalCap)
    }

    /// Folds one changelog record: a journal entry (its key starts with `:`) or a user's state.
    mutating func fold(key: [UInt8]?, value: [UInt8], horizonMs: Int64) throws(EventValidationError) {
        if JournalRecord.isJournalKey(key) {
            let record = try JournalRecord(jsonBytes: value)
            journalRecords += 1
            // Results past the retention are forgotten; an open intent never is (its call may have
            // reached billing: only a recovery call may ask again).
            guard record.entry.result == nil || record.entry.lastTouchedMs >= horizonMs else { return }
            journal.record(userKey: record.userKey, seq: record.seq, record.entry)
        } else {
            let state = try EntitlementStateRecord(jsonBytes: value)
            states[state.key] = state
        }
    }
}

extension RestoredPartition {
    /// Takes the intents among records a restore could not read: held past the committed end by a
    /// transaction (docs/STATE.md, Restore), in offset order. Their calls may have reached billing
    /// (a transaction the broker committed and left undecided: the intent's commit comes before
    /// the call), so each request is open under the highest such attempt, and its recovery call
    /// takes a new attempt number, never one already used. An entry read already at that attempt
    /// or a later one stays. The records' results and states are not taken: they may never be
    /// committed. Returns the requests taken, by id.
    @discardableResult
    mutating func takeHeldIntents(_ records: [JournalRecord]) -> Set<String> {
        var taken: Set<String> = []
        for record in records where record.entry.result == nil {
            let earlier = journal.entry(userKey: record.userKey, requestID: record.entry.requestID)
            if let earlier, earlier.attempts >= record.entry.attempts { continue }
            var entry = record.entry
            entry.offset = entry.offset ?? earlier?.offset
            entry.inDoubtSinceMs = entry.inDoubtSinceMs ?? earlier?.inDoubtSinceMs
            entry.digest = entry.digest ?? earlier?.digest
            journal.record(userKey: record.userKey, seq: record.seq, entry)
            taken.insert(entry.requestID)
        }
        return taken
    }
}
