import EncoreEvents
import Foundation
import Testing

@testable import EncoreProcessor

/// The request journal's flat table against a plain model: what it remembers after many users'
/// requests, slot replacements, retention and moves inside the table.
@Suite("Request memory: the flat table of journal v2 (no Kafka)")
struct RequestMemoryTests {
    typealias Entry = EntitlementStateRecord.RequestEntry
    static let t0: Int64 = 1_764_475_643_000
    /// Offsets from here on are further than 2^37 from the model test's first ones.
    static let farOffset: Int64 = 1 << 40

    /// What a settled entry reads back as: its start is its completion (the table keeps one time).
    /// One whose offset is too far from the table's first (`farOffset`) is kept whole.
    static func readBack(_ entry: Entry) -> Entry {
        if let offset = entry.offset, offset >= farOffset { return entry }
        var expected = entry
        expected.startedAtMs = entry.completedAtMs ?? entry.startedAtMs
        return expected
    }

    @Test(
        "20,000 requests of 300 users, cap 3: exactly each user's last 3 are remembered, as journaled (the table in one chunk; in chunks of 7 entries, which moves entries across chunks; with index buckets that keep distances up to 3 only, in one chunk and in chunks of 7)",
        arguments: [
            (ChunkedArray<RequestMemory.Settled>.defaultChunkCapacity, 4), (7, 4),
            (ChunkedArray<RequestMemory.Settled>.defaultChunkCapacity, 30), (7, 30),
        ])
    func matchesModel(chunkCapacity: Int, leastPositionBits: Int) {
        var memory = RequestMemory(cap: 3, chunkCapacity: chunkCapacity, leastPositionBits: leastPositionBits)
        var random = SplitMix64(seed: 29)
        // Per user, the settled entries in journal order; every request id ever issued.
        var model: [String: [Entry]] = [:]
        var issued: [(user: String, id: String)] = []
        for step in 0..<20_000 {
            let user = "app:u\(random.next() % 300)"
            let id = "req-\(step)"
            issued.append((user, id))
            let seq = memory.allocate(user: UserLane(key: user))
            let started = Self.t0 + Int64(step)
            memory.record(userKey: user, seq: seq, Entry(requestID: id, attempts: 1, startedAtMs: started))
            #expect(memory.entry(userKey: user, requestID: id)?.result == nil)
            let results: [OutcomeResult] = [.purchased, .cancelled, .pending, .notAttempted]
            let result = Entry(
                requestID: id, attempts: Int(random.next() % 5), startedAtMs: started,
                result: results[Int(random.next() % 4)], completedAtMs: started + 7,
                offset: random.next() % 3 == 0
                    ? nil : random.next() % 50 == 0 ? Self.farOffset + Int64(step) : Int64(step),
                digest: String(format: "%016llx", step + 1))
            memory.record(userKey: user, seq: seq, result)
            model[user, default: []].append(result)
            if model[user]!.count > 3 { model[user]!.removeFirst() }
        }
        func check(_ label: String) {
            var remembered = 0
            for (user, id) in issued {
                let expected = model[user]?.first { $0.requestID == id }
                #expect(memory.entry(userKey: user, requestID: id) == expected.map(Self.readBack), "\(label) \(id)")
                if expected != nil { remembered += 1 }
            }
            #expect(memory.count == remembered, "\(label)")
        }
        check("after the writes")
        #expect(memory.indexBuckets * 4 >= memory.settledCount * 5, "the index is at most 80% full")
        #expect(memory.indexBuckets * 2 < memory.settledCount * 5, "and at least 40% (60% after it grows)")
        // Retention: everything completed before the horizon goes, the rest stays. With small
        // chunks, more than a quarter of the table is then free: the last entries move into the
        // free slots and the tail is let go.
        let slotsBefore = memory.settledSlots
        let bucketsBefore = memory.indexBuckets
        let horizon = Self.t0 + 19_600
        memory.prune(untouchedBefore: horizon)
        for user in model.keys { model[user]!.removeAll { $0.completedAtMs! < horizon } }
        check("after the prune")
        if chunkCapacity == 7 {
            #expect(memory.settledSlots == memory.settledCount && memory.settledSlots < slotsBefore)
            // (Shrunk to 60% full.)
            #expect(memory.indexBuckets < bucketsBefore && memory.indexBuckets == memory.settledCount * 5 / 3)
        } else {
            #expect(memory.settledSlots == slotsBefore, "a prune freeing less than a chunk keeps its slots")
            #expect(memory.indexBuckets == bucketsBefore)
        }
        // Every user goes on (those with all pruned from a new counter): three new requests each,
        // so each slot of each ring replaces what it held, moved or not.
        for user in model.keys.sorted() {
            for round in 0..<3 {
                let seq = memory.allocate(user: UserLane(key: user))
                let entry = Entry(
                    requestID: "new-\(round)-\(user)", attempts: 1, startedAtMs: Self.t0, result: .purchased,
                    completedAtMs: Self.t0 + 20_000 + Int64(round))
                memory.record(userKey: user, seq: seq, entry)
                model[user]!.append(entry)
                if model[user]!.count > 3 { model[user]!.removeFirst() }
                issued.append((user, entry.requestID))
            }
        }
        check("after new requests")
        #expect(memory.bytesPerRequest > 0 && MemoryLayout<RequestMemory.Settled>.stride == 36)
        // Users let go (kept in the state store): all of theirs goes, the others' stays in place.
        for (index, user) in model.keys.sorted().enumerated() where index % 3 == 0 {
            memory.forget(userKey: user)
            model[user] = nil
        }
        check("after users were let go")
    }

    @Test(
        "a user's open requests are counted as they open and settle; a user let go and read back starts from its records"
    )
    func openRequestsAndForget() {
        var memory = RequestMemory(cap: 2)
        let seq = memory.allocate(user: UserLane(key: "app:a"))
        memory.record(userKey: "app:a", seq: seq, Entry(requestID: "r1", attempts: 1, startedAtMs: Self.t0))
        #expect(memory.hasOpenRequest(ofUser: "app:a") && !memory.hasOpenRequest(ofUser: "app:b"))
        let done = Entry(
            requestID: "r1", attempts: 1, startedAtMs: Self.t0, result: .purchased, completedAtMs: Self.t0 + 1)
        memory.record(userKey: "app:a", seq: seq, done)
        #expect(!memory.hasOpenRequest(ofUser: "app:a"))
        memory.forget(userKey: "app:a")
        #expect(memory.count == 0 && memory.entry(userKey: "app:a", requestID: "r1") == nil)
        // Read back from its records: the same entry, the counter past it.
        memory.record(userKey: "app:a", seq: seq, done)
        #expect(memory.entry(userKey: "app:a", requestID: "r1") == Self.readBack(done))
        #expect(memory.allocate(user: UserLane(key: "app:a")) == seq + 1)
    }

    @Test("open intents, in-doubt marks and decided failures are kept whole; a legacy entry never hides a newer one")
    func wholeEntries() {
        var memory = RequestMemory(cap: 2)
        let failure = PurchaseOutcomeEvent.Failure(type: "card_declined", message: "declined", retryable: false)
        let failed = Entry(
            requestID: "r0", attempts: 1, startedAtMs: Self.t0, result: .failed, completedAtMs: Self.t0 + 1,
            error: failure, controller: "store", offset: 4, digest: "00000000000000aa")
        memory.record(userKey: "app:u", seq: memory.allocate(user: UserLane(key: "app:u")), failed)
        #expect(memory.entry(userKey: "app:u", requestID: "r0") == failed)
        #expect(memory.count == 1, "a decided failure is one request, kept whole and settled")
        let inDoubt = Entry(requestID: "r1", attempts: 4, startedAtMs: Self.t0, offset: 5, inDoubtSinceMs: Self.t0 + 9)
        let seq = memory.allocate(user: UserLane(key: "app:u"))
        memory.record(userKey: "app:u", seq: seq, inDoubt)
        #expect(
            memory.entry(userKey: "app:u", requestID: "r1") == inDoubt
                && memory.seq(of: .init(userKey: "app:u", requestID: "r1")) == seq)
        // An earlier version's entry for r1 does not replace the newer one; one for r9 is taken.
        memory.recordLegacy(userKey: "app:u", Entry(requestID: "r1", attempts: 1, startedAtMs: Self.t0))
        memory.recordLegacy(
            userKey: "app:u",
            Entry(requestID: "r9", attempts: 1, startedAtMs: Self.t0, result: .cancelled, completedAtMs: Self.t0))
        #expect(memory.entry(userKey: "app:u", requestID: "r1") == inDoubt)
        #expect(memory.entry(userKey: "app:u", requestID: "r9")?.result == .cancelled)
        // The third request takes r0's slot: r0 and its error are forgotten; the intent stays.
        memory.record(
            userKey: "app:u", seq: memory.allocate(user: UserLane(key: "app:u")),
            Entry(requestID: "r2", attempts: 1, startedAtMs: Self.t0, result: .purchased, completedAtMs: Self.t0))
        #expect(memory.entry(userKey: "app:u", requestID: "r0") == nil)
        #expect(memory.entry(userKey: "app:u", requestID: "r1") == inDoubt)
    }

    @Test(
        "a request recorded again under another slot is let go by its first slot: that slot's next request does not evict it"
    )
    func recordedAgainUnderAnotherSlot() {
        var memory = RequestMemory(cap: 3)
        let user = UserLane(key: "app:u")
        func settled(_ id: String) -> Entry {
            Entry(requestID: id, attempts: 1, startedAtMs: Self.t0, result: .purchased, completedAtMs: Self.t0)
        }
        memory.record(userKey: user.key, seq: memory.allocate(user: user), settled("r0"))  // slot 0
        // Its records read back again, the later one under seq 1 (slot 1): it takes the slot it had.
        memory.record(userKey: user.key, seq: memory.allocate(user: user), settled("r0"))
        #expect(memory.settledCount == 1 && memory.settledSlots == 1)
        memory.record(userKey: user.key, seq: memory.allocate(user: user), settled("r2"))  // slot 2
        memory.record(userKey: user.key, seq: memory.allocate(user: user), settled("r3"))  // slot 0 again
        #expect(memory.entry(userKey: user.key, requestID: "r0") == Self.readBack(settled("r0")), "r0 is in slot 1")
        #expect(memory.settledCount == 3)
    }

    @Test(
        "a time or offset out of a settled entry's range is kept whole, exactly, at each bound; a slot freed is taken again"
    )
    func outOfRange() {
        var memory = RequestMemory(cap: 8)
        let user = UserLane(key: "app:u")
        let half: Int64 = 1 << 37
        // (Started before completed: a settled entry reads back with one time, a whole one exactly.)
        func entry(_ id: String, completedAtMs: Int64 = Self.t0, offset: Int64?) -> Entry {
            Entry(
                requestID: id, attempts: 2, startedAtMs: completedAtMs - 5, result: .cancelled,
                completedAtMs: completedAtMs, offset: offset)
        }
        let base: Int64 = 1_000
        let cases: [(entry: Entry, settled: Bool)] = [
            (entry("first", offset: base), true),  // the table's offsets are relative to this one
            (entry("top", offset: base + half - 1), true),  // the code's highest bit set
            (entry("past-top", offset: base + half), false),
            (entry("bottom", offset: base - half + 1), true),
            (entry("past-bottom", offset: base - half), false),
            (entry("late", completedAtMs: (1 << 42) - 1, offset: 7), true),
            (entry("too-late", completedAtMs: 1 << 42, offset: 7), false),
            (entry("before-1970", completedAtMs: -1, offset: 7), false),
        ]
        for (entry, _) in cases { memory.record(userKey: user.key, seq: memory.allocate(user: user), entry) }
        for (entry, settled) in cases {
            #expect(
                memory.entry(userKey: user.key, requestID: entry.requestID) == (settled ? Self.readBack(entry) : entry),
                "\(entry.requestID)")
        }
        #expect(memory.count == cases.count && memory.settledCount == cases.count)
        // Kept whole for its range only, it is settled: no open counter, not an earlier version's open entry.
        let far = RequestMemory.Key(userKey: user.key, requestID: "past-top")
        #expect(memory.seq(of: far) == nil && !memory.isLegacyOpen(far))
        let legacy = entry("legacy", offset: base - half)
        memory.recordLegacy(userKey: user.key, legacy)
        #expect(!memory.isLegacyOpen(RequestMemory.Key(userKey: user.key, requestID: "legacy")))
        #expect(memory.entry(userKey: user.key, requestID: "legacy") == legacy)
        // A new request takes the first one's slot in the ring, and the slot it freed in the table.
        let next = entry("next", offset: base + 1)
        memory.record(userKey: user.key, seq: memory.allocate(user: user), next)
        #expect(memory.entry(userKey: user.key, requestID: "first") == nil)
        #expect(memory.entry(userKey: user.key, requestID: "next") == Self.readBack(next))
        #expect(memory.settledSlots == cases.count + 1 && memory.count == cases.count + 1)
    }

    @Test("an open intent is never forgotten for the retention, on restore or prune, and its user's counter goes on")
    func openIntentsOutliveRetention() throws {
        let old = Entry(requestID: "r0", attempts: 2, startedAtMs: Self.t0, offset: 3)
        var restored = RestoredPartition(journalCap: 3)
        let intent = JournalRecord(appID: "app", appUserID: "u", seq: 7, entry: old)
        let result = JournalRecord(
            appID: "app", appUserID: "v", seq: 0,
            entry: Entry(requestID: "r1", attempts: 1, startedAtMs: Self.t0, result: .purchased, completedAtMs: Self.t0)
        )
        let horizon = Self.t0 + 30 * 86_400_000
        for record in [intent, result] {
            try restored.fold(key: record.key(slotCount: 3), value: record.jsonBytes(), horizonMs: horizon)
        }
        var memory = restored.journal
        #expect(memory.entry(userKey: "app:u", requestID: "r0") == old, "a call may have reached billing")
        #expect(memory.entry(userKey: "app:v", requestID: "r1") == nil, "a result past the retention goes")
        memory.prune(untouchedBefore: horizon)
        #expect(memory.entry(userKey: "app:u", requestID: "r0") == old)
        // The user's counter went past the intent's: the next request takes a later slot.
        #expect(memory.allocate(user: UserLane(key: "app:u")) == 8)
    }

    @Test("a journal key is ':{slot}:…'; an earlier state key starting with ':' is not one")
    func journalKeys() {
        #expect(JournalRecord.isJournalKey(Array(":12:app:u".utf8)))
        #expect(!JournalRecord.isJournalKey(Array(":x:u".utf8)) && !JournalRecord.isJournalKey(Array("::u".utf8)))
        #expect(!JournalRecord.isJournalKey(Array("app:u".utf8)) && !JournalRecord.isJournalKey(nil))
    }
}
