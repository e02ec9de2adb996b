import EncoreEvents

/// Where a ledger that keeps only some users in memory reads the others: the local state store,
/// overlaid by what was acknowledged and is not written there yet (``StateStoreWriter``). Read on
/// the worker's thread.
protocol UserStateSource: Sendable {
    /// The user's changelog records (state and journal) as the changelog holds them now. Asked
    /// only for a user the worker has no unacknowledged update of.
    func records(ofUser key: String, partition: Int32) throws -> [(key: [UInt8], value: [UInt8])]
    /// Up to `limit` users of the partition whose earliest expiry is after `cursor` and at or before
    /// `throughMs`, in expiry order, and the cursor past them.
    func dueUsers(
        of partition: Int32, after cursor: [UInt8]?, throughMs: Int64, limit: Int
    ) throws -> (users: [String], cursor: [UInt8]?)
    /// Whether the partition's records reach the store (its expiry index follows them).
    func takesWrites(of partition: Int32) -> Bool
    /// Whether records of the user are acknowledged and not yet in the store (nor its indexes).
    func hasUnwritten(user key: String, partition: Int32) -> Bool
}

/// Users in memory when the ledger reads the others from a ``UserStateSource`` (docs/STATE.md,
/// Users in memory).
struct ResidentUsers: Sendable {
    struct Resident: Sendable {
        var partition: Int32
        /// Used since the eviction pass last looked at it (a second chance).
        var used: Bool
    }

    let source: any UserStateSource
    /// How many users stay in memory, besides those that must (``EntitlementLedger/evict(isPinned:)``).
    let limit: Int
    var residents: [String: Resident] = [:]
    /// Residents in the order they came (stale keys are skipped).
    var order = FIFO<String>()
    /// Per partition: how far the store's expiry index was read.
    var expiryCursors: [Int32: [UInt8]] = [:]
    /// When the expiry index is read next (once a second, sooner while a read was cut short).
    var nextDueReadMs: Int64 = .min
    var loads = 0
    var evictions = 0
}

extension EntitlementLedger {
    /// Users whose expiry is this close are kept in memory: the store's expiry index may not have
    /// their latest state yet (it is written every commit interval).
    static let expiryPinMs: Int64 = 60_000
    /// Most users one read of the store's expiry index takes, per partition.
    static let dueUsersPerTick = 1_000

    /// Keeps only some users in memory: the others are read from `source` when their records
    /// arrive; at most `limit` stay beside the ones that must (in flight, unwritten, expiring soon).
    mutating func keepResident(atMost limit: Int, source: any UserStateSource) {
        resident = ResidentUsers(source: source, limit: limit)
    }

    var keepsSomeUsers: Bool { resident != nil }

    /// Users in memory, users read from the store and users let go since the start.
    var residentFigures: (users: Int, loads: Int, evictions: Int) {
        guard let resident else { return (userCount, 0, 0) }
        return (resident.residents.count, resident.loads, resident.evictions)
    }

    /// Users the restore read at once (their open requests): in memory already.
    mutating func markResident(_ keys: some Sequence<String>, partition: Int32) {
        guard resident != nil else { return }
        for key in keys where resident!.residents[key] == nil {
            resident!.residents[key] = .init(partition: partition, used: true)
            resident!.order.append(key)
        }
    }

    /// Makes sure the user's state and journal are in memory: read from the source when not.
    mutating func load(_ key: String, partition: Int32) {
        guard resident != nil else { return }
        if resident!.residents[key] != nil {
            resident!.residents[key]!.used = true
            return
        }
        let records: [(key: [UInt8], value: [UInt8])]
        do {
            records = try resident!.source.records(ofUser: key, partition: partition)
        } catch {
            // Going on without the user's journal could call billing twice for a request it
            // answered: stop (fail closed). A restart checks the store and rebuilds what it cannot read.
            fatalError("cannot read user \(key) of partition \(partition) from the state store: \(error)")
        }
        resident!.residents[key] = .init(partition: partition, used: true)
        resident!.order.append(key)
        resident!.loads += 1
        var state: EntitlementStateRecord? = nil
        let horizon = nowMs - journal.retentionMs
        for record in records {
            if JournalRecord.isJournalKey(record.key) {
                guard let read = try? JournalRecord(jsonBytes: record.value) else {
                    Self.unreadable(record, of: key, partition: partition)
                }
                // As a restore folds it: results past the retention are forgotten, open intents never.
                guard read.entry.result == nil || read.entry.lastTouchedMs >= horizon else { continue }
                withJournal(partition) { $0.record(userKey: key, seq: read.seq, read.entry) }
            } else if let read = try? EntitlementStateRecord(jsonBytes: record.value) {
                state = read
            } else {
                Self.unreadable(record, of: key, partition: partition)
            }
        }
        // The journal's records first: an earlier version's journal in the state is older.
        if let state { restore(state, partition: partition, nowMs: nowMs) }
    }

    /// A record of the user that is no valid state or journal record (as a restore of every user
    /// refuses to start on one): without it the user's journal or state would be incomplete, and a
    /// re-sent request could be called again. Stops the process (fail closed).
    private static func unreadable(_ record: (key: [UInt8], value: [UInt8]), of key: String, partition: Int32) -> Never
    {
        fatalError(
            "the state store's record \(String(decoding: record.key, as: UTF8.self)) of user \(key) (changelog partition \(partition)) is no valid state or journal record; remove it from the changelog or fix it, then rebuild the store (remove --state-dir)"
        )
    }

    /// Reads the users of `partitions` whose expiry is due by `nowMs` from the store's index, so
    /// that ``expire(nowMs:)`` settles them (at most ``dueUsersPerTick`` per partition a call).
    mutating func loadDueUsers(of partitions: some Sequence<Int32>) {
        guard let source = resident?.source, nowMs >= resident!.nextDueReadMs else { return }
        resident!.nextDueReadMs = nowMs + 1_000
        for partition in partitions {
            let due: (users: [String], cursor: [UInt8]?)
            do {
                due = try source.dueUsers(
                    of: partition, after: resident!.expiryCursors[partition], throughMs: nowMs,
                    limit: Self.dueUsersPerTick)
            } catch {
                fatalError("cannot read the state store's expiry index of partition \(partition): \(error)")
            }
            resident!.expiryCursors[partition] = due.cursor
            for key in due.users { load(key, partition: partition) }
            // (More may be due: read on at the next tick.)
            if due.users.count == Self.dueUsersPerTick { resident!.nextDueReadMs = nowMs }
        }
    }

    /// Lets go of users beyond the limit, oldest first, skipping those used since the last pass
    /// once and those that must stay: `isPinned` (an unacknowledged update), an open request, an
    /// earlier version's journal in the state, an expiry within ``expiryPinMs``, a partition
    /// whose records the store does not take.
    mutating func evict(isPinned: (String) -> Bool) {
        guard var users = resident, users.residents.count > users.limit else { return }
        resident = nil  // (Taken out while it changes: no copy of the tables.)
        defer { resident = users }
        var looked = 0
        // (Bounded per tick: when most users must stay, a pass over all of them each tick would
        // cost more than it frees.)
        let queued = min(users.order.count, 4 * (users.residents.count - users.limit) + 1_024)
        while users.residents.count > users.limit, looked < queued, let key = users.order.popFirst() {
            looked += 1
            guard let entry = users.residents[key] else { continue }
            if entry.used || isPinned(key) || mustStay(key, partition: entry.partition)
                || !users.source.takesWrites(of: entry.partition)
                || users.source.hasUnwritten(user: key, partition: entry.partition)
            {
                users.residents[key]!.used = false
                users.order.append(key)
                continue
            }
            users.residents[key] = nil
            users.evictions += 1
            forget(key, partition: entry.partition)
        }
        dropStaleExpiries()
    }

    /// Forgets the resident bookkeeping of partitions no longer owned.
    mutating func removeResidents(of partitions: Set<Int32>) {
        guard resident != nil else { return }
        resident!.residents = resident!.residents.filter { !partitions.contains($0.value.partition) }
        let residents = resident!.residents
        _ = resident!.order.removeAll { residents[$0] == nil }
        for partition in partitions { resident!.expiryCursors[partition] = nil }
    }
}
