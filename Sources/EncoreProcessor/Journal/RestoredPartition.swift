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
    /// Takes what a restore could not read of the request journal: `records` held past the
    /// committed end by a transaction (docs/STATE.md, Restore), in offset order. Each slot's latest
    /// record there (what a full read or compaction leaves of it) tells that its request's call of
    /// that attempt may have reached billing (a transaction the broker committed and left
    /// undecided: an intent's commit comes before its call), so the request is open under that
    /// attempt, unless what was read has that attempt or a later one; its recovery call then takes
    /// a new attempt number, never one already used. A result there counts as its attempt's
    /// intent, never as an answer: it may never be committed. Returns the requests taken, by id.
    @discardableResult
    mutating func takeHeldIntents(_ records: [JournalRecord]) -> Set<String> {
        var latest: [[UInt8]: JournalRecord] = [:]
        for record in records { latest[record.key(slotCount: journal.cap)] = record }
        var taken: Set<String> = []
        for record in latest.values.sorted(by: { ($0.userKey, $0.seq) < ($1.userKey, $1.seq) }) {
            let earlier = journal.entry(userKey: record.userKey, requestID: record.entry.requestID)
            if let earlier, earlier.attempts >= record.entry.attempts { continue }
            let held = record.entry
            journal.record(
                userKey: record.userKey, seq: record.seq,
                .init(
                    requestID: held.requestID, attempts: held.attempts, startedAtMs: held.startedAtMs,
                    offset: held.offset ?? earlier?.offset,
                    inDoubtSinceMs: held.inDoubtSinceMs ?? earlier?.inDoubtSinceMs,
                    digest: held.digest ?? earlier?.digest))
            taken.insert(held.requestID)
        }
        return taken
    }
}
