import EncoreEvents

/// A request's user key and its key in the journal, built once per request (hashing them is a
/// share of a request's cost): the worker keeps them with its work item.
struct JournalIdentity: Sendable {
    /// The user's lane: the user's key and its seeded hash.
    let user: UserLane
    /// The request's key in the journal (``RequestMemory/Key``).
    let requestKey: RequestMemory.Key

    var userKey: String { user.key }

    init(user: UserLane, requestID: String) {
        self.user = user
        requestKey = RequestMemory.Key(userKey: user.key, requestID: requestID)
    }
}

/// One partition's remembered requests (journal v2): what deduplicates a re-sent request, finds a
/// request an earlier process left open, and rebuilds a failure the processor decided.
///
/// Settled requests live in a flat table (kept in chunks, ``ChunkedArray``) of fixed 36-byte
/// entries (a 128-bit key, the content digest, the record's offset, the time, the attempts and
/// result), found through an index of 32-bit buckets: no string or JSON per entry. An entry
/// keeps its slot while it lives; a freed slot is taken again, and a prune that frees much of the
/// table moves the last entries down and lets the tail go. The few requests that need more (an
/// open intent, a request in doubt, a decided failure with its error, an offset or time out of
/// the entry's range) are kept whole beside it.
///
/// Each user has a journal counter (`seq`); a request's records go to the user's slot `seq % cap`,
/// so a new request replaces the one `cap` requests older, here as on the changelog. A request in
/// flight or in doubt is never replaced: its user's lane is held, so no newer request of the user
/// is journaled meanwhile. Entries untouched for longer than the retention go at ``prune(nowMs:)``.
struct RequestMemory: Sendable {
    /// A request's identity: two independent 64-bit hashes of its user key and request id.
    struct Key: Hashable, Sendable {
        var low: UInt64
        var high: UInt64

        init(low: UInt64, high: UInt64) {
            self.low = low
            self.high = high
        }

        init(userKey: String, requestID: String) {
            var first = Hasher()
            first.combine(userKey)
            first.combine(requestID)
            var second = Hasher()
            second.combine(UInt8(0x5b))
            second.combine(userKey)
            second.combine(requestID)
            low = UInt64(bitPattern: Int64(first.finalize()))
            high = UInt64(bitPattern: Int64(second.finalize()))
        }

        /// Without a third `Hasher`: `low` is already a seeded hash of the key.
        func _rawHashValue(seed: Int) -> Int { mixedHash(low ^ UInt64(bitPattern: Int64(seed))) }
    }

    /// A settled request: 36 bytes, as nine 32-bit words (64-bit fields would align it to 8 and
    /// pad it to 40). Its slot in the table never moves while it lives: a user's ring points at it.
    struct Settled: Sendable {
        private var key0, key1, key2, key3: UInt32
        private var digest0, digest1: UInt32
        /// Bits 0–41: the completion time (ms since 1970, up to the year 2109); bits 42–57:
        /// ``tally``; bits 58–95: ``offsetCode``.
        private var packed0, packed1, packed2: UInt32

        static let timeLimit: Int64 = 1 << 42
        static let offsetCodeLimit: Int64 = 1 << 38
        /// The tally of a free slot (no result has the index 15).
        private static let freeTally: UInt16 = 0xffff

        /// `completedAtMs` is kept within `0..<timeLimit`, `offsetCode` must be below `offsetCodeLimit`.
        init(key: Key, digest: UInt64, completedAtMs: Int64, tally: UInt16, offsetCode: Int64) {
            key0 = UInt32(truncatingIfNeeded: key.low)
            key1 = UInt32(truncatingIfNeeded: key.low >> 32)
            key2 = UInt32(truncatingIfNeeded: key.high)
            key3 = UInt32(truncatingIfNeeded: key.high >> 32)
            digest0 = UInt32(truncatingIfNeeded: digest)
            digest1 = UInt32(truncatingIfNeeded: digest >> 32)
            let time = UInt64(min(max(completedAtMs, 0), Self.timeLimit - 1))
            let code = UInt64(offsetCode)
            let low = time | UInt64(tally) << 42 | code << 58
            packed0 = UInt32(truncatingIfNeeded: low)
            packed1 = UInt32(truncatingIfNeeded: low >> 32)
            packed2 = UInt32(truncatingIfNeeded: code >> 6)
        }

        var key: Key { Key(low: UInt64(key1) << 32 | UInt64(key0), high: UInt64(key3) << 32 | UInt64(key2)) }
        /// The content digest's 64 bits (`PurchaseRequestEvent.contentDigest`); 0: none journaled.
        var digest: UInt64 { UInt64(digest1) << 32 | UInt64(digest0) }
        private var low: UInt64 { UInt64(packed1) << 32 | UInt64(packed0) }
        var completedAtMs: Int64 { Int64(low & UInt64(Self.timeLimit - 1)) }
        /// Attempts (up to 4,095) in the low 12 bits, the result's index above them.
        var tally: UInt16 { UInt16(truncatingIfNeeded: low >> 42) }
        /// The request record's offset, coded by ``RequestMemory`` (0: not journaled).
        var offsetCode: Int64 { Int64(low >> 58 | UInt64(packed2) << 6) }

        var result: OutcomeResult { RequestMemory.results[Int(tally >> 12)] }
        var attempts: Int { Int(tally & 0xfff) }

        var isFree: Bool { tally == Self.freeTally }
        mutating func free() {
            packed0 = 0
            packed1 = UInt32(Self.freeTally) << 10
            packed2 = 0
        }
    }

    /// What is kept whole: open intents, in-doubt requests, decided failures.
    struct Detail: Sendable {
        /// The journal counter of the request's slot; `nil` for an entry of an earlier journal
        /// version (a new slot is taken when it is written again).
        var seq: Int64?
        var entry: EntitlementStateRecord.RequestEntry
        /// The user's index in `users` (kept while the user has an entry); -1 with no slot.
        var user: Int32
        /// Kept whole only because its offset or time is out of a settled entry's range: for
        /// ``seq(of:)`` and ``isLegacyOpen(_:)`` it is a settled entry like the others.
        var onlyForRange = false
    }

    private struct User: Sendable {
        var key: String
        var nextSeq: Int64 = 0
        /// Settled entries' positions by slot (`seq % cap`); -1: empty. Grows up to `cap`.
        var ring: [Int32] = []
        /// Its requests in flight or in doubt (details with no result).
        var openRequests: Int32 = 0
    }

    let cap: Int
    /// Settled entries' slots; a free one (``Settled/isFree``) is listed in `freeSlots` and taken
    /// again before the table grows.
    private var settled: ChunkedArray<Settled>
    private var freeSlots: [Int32] = []
    /// Open addressing with linear probing over any number of buckets (a key's home is a
    /// multiply-shift of its hash), 60 to 80% full. A bucket is 0 (empty) or a settled entry's
    /// position + 1 in its low `positionBits` bits and its distance from its home above them
    /// (saturating at ``farthest``): a probe passes an entry of another home without reading the
    /// table, and a removal closes its gap without reading it (but for a saturated distance).
    private var index: [UInt32] = Array(repeating: 0, count: 16)
    private var positionBits = 8
    /// Tests raise it to leave few bits for distances, so that they saturate.
    private let leastPositionBits: Int
    private var details: [Key: Detail] = [:]
    /// Details with no result (open intents, requests in doubt).
    private var openDetails = 0
    private var users: [User] = []
    private var userIDs: [UserLane: Int32] = [:]
    private var freeUsers: [Int32] = []
    /// Offsets are kept relative to the first one recorded (38 bits: 137 billion records either
    /// side of it); one further away is kept in a whole entry.
    private var offsetBase: Int64?

    /// `chunkCapacity`: settled entries per chunk of the table, `leastPositionBits`: of an index
    /// bucket's 32 bits, how many at least hold a position (tests make the one small and the other
    /// large).
    init(cap: Int, chunkCapacity: Int = ChunkedArray<Settled>.defaultChunkCapacity, leastPositionBits: Int = 4) {
        precondition((1...4096).contains(cap), "the per-user cap is 1 to 4,096")
        precondition((1...32).contains(leastPositionBits), "a bucket's position bits are 1 to 32")
        self.cap = cap
        settled = ChunkedArray(chunkCapacity: chunkCapacity)
        self.leastPositionBits = leastPositionBits
        positionBits = max(positionBits, leastPositionBits)
    }

    /// Requests remembered: settled, and open ones (kept whole only; a whole entry with a result
    /// has a settled one too).
    var count: Int { settledCount + openDetails }
    var settledCount: Int { settled.count - freeSlots.count }
    /// Slots of the table, in use or free, and buckets of its index.
    var settledSlots: Int { settled.count }
    var indexBuckets: Int { index.count }

    /// About how many bytes the table takes per remembered request (entries, index, users).
    var bytesPerRequest: Double {
        guard count > 0 else { return 0 }
        let bytes =
            settled.capacity * MemoryLayout<Settled>.stride + freeSlots.capacity * 4 + indexBuckets * 4
            + details.count * 256 + users.reduce(0) { $0 + 64 + $1.key.utf8.count + $1.ring.capacity * 4 }
        return Double(bytes) / Double(count)
    }

    // MARK: Reading

    /// The journal's entry for `requestID` of the user, if remembered.
    func entry(userKey: String, requestID: String) -> EntitlementStateRecord.RequestEntry? {
        entry(Key(userKey: userKey, requestID: requestID), requestID: requestID)
    }

    func entry(_ key: Key, requestID: String) -> EntitlementStateRecord.RequestEntry? {
        if let detail = details[key] { return detail.entry }
        guard let position = find(key) else { return nil }
        let entry = settled[position]
        return .init(
            requestID: requestID, attempts: entry.attempts, startedAtMs: entry.completedAtMs, result: entry.result,
            completedAtMs: entry.completedAtMs, offset: offset(decoding: entry.offsetCode),
            digest: entry.digest == 0 ? nil : Self.hex(entry.digest))
    }

    /// The journal counter of the request's open entry, if it has one.
    func seq(of key: Key) -> Int64? { details[key].flatMap { $0.onlyForRange ? nil : $0.seq } }

    // MARK: Writing

    /// Takes the user's next journal counter: its slot's older request is forgotten (its record
    /// is replaced on the changelog by the one this counter writes).
    mutating func allocate(user lane: UserLane) -> Int64 {
        let user = intern(lane)
        let seq = users[Int(user)].nextSeq
        users[Int(user)].nextSeq += 1
        let slot = Int(seq % Int64(cap))
        if slot < users[Int(user)].ring.count, users[Int(user)].ring[slot] >= 0 {
            remove(at: Int(users[Int(user)].ring[slot]))
            users[Int(user)].ring[slot] = -1
        }
        return seq
    }

    /// Records a journal entry the processor wrote (or read back from the changelog) under `seq`.
    mutating func record(userKey: String, seq: Int64?, _ entry: EntitlementStateRecord.RequestEntry) {
        record(Key(userKey: userKey, requestID: entry.requestID), user: UserLane(key: userKey), seq: seq, entry)
    }

    /// `key` must be the key of the user's key and the entry's request id.
    mutating func record(_ key: Key, user lane: UserLane, seq: Int64?, _ entry: EntitlementStateRecord.RequestEntry) {
        if let position = find(key) {
            remove(at: position)
            // (Its slot may be another than the new record's: the ring lets go of it.)
            if let user = userIDs[lane] {
                for slot in users[Int(user)].ring.indices where users[Int(user)].ring[slot] == Int32(position) {
                    users[Int(user)].ring[slot] = -1
                }
            }
        }
        let completedAtMs = entry.completedAtMs ?? entry.startedAtMs
        var offsetCode: Int64? = 0
        if let offset = entry.offset { offsetCode = code(offset: offset) }
        let isWhole = entry.result == nil || entry.error != nil || entry.attempts > 0xfff
        let isOutOfRange = offsetCode == nil || !(0..<Settled.timeLimit).contains(completedAtMs)
        var user: Int32 = -1
        if let seq {
            // (A restored intent moves the counter on too: the next request takes a later slot.)
            user = intern(lane)
            users[Int(user)].nextSeq = max(users[Int(user)].nextSeq, seq + 1)
        }
        setDetail(
            key,
            isWhole || isOutOfRange ? Detail(seq: seq, entry: entry, user: user, onlyForRange: !isWhole) : nil)
        guard let result = entry.result else { return }
        var slot = 0
        if let seq {
            slot = Int(seq % Int64(cap))
            if users[Int(user)].ring.count <= slot {
                // Doubling, but never past the cap: a full ring is `cap` slots, not the next power of two.
                let capacity = users[Int(user)].ring.capacity
                if capacity <= slot { users[Int(user)].ring.reserveCapacity(min(cap, max(slot + 1, capacity * 2))) }
                while users[Int(user)].ring.count <= slot { users[Int(user)].ring.append(-1) }
            }
            // (Read back: a later record of the slot replaces an earlier one.)
            let occupant = users[Int(user)].ring[slot]
            if occupant >= 0 { remove(at: Int(occupant)) }
        }
        let resultIndex = UInt16(Self.index(of: result))
        let position = insert(
            Settled(
                key: key, digest: entry.digest.flatMap { UInt64($0, radix: 16) } ?? 0, completedAtMs: completedAtMs,
                tally: resultIndex << 12 | UInt16(min(entry.attempts, 0xfff)), offsetCode: offsetCode ?? 0))
        if user >= 0 { users[Int(user)].ring[slot] = position }
    }

    /// An entry of the journal kept in a state record by an earlier version: remembered unless a
    /// newer record of the same request is (it is older than every journal record), with no slot.
    /// Whether it was taken: `false` when a journal record of the request is remembered.
    @discardableResult
    mutating func recordLegacy(userKey: String, _ entry: EntitlementStateRecord.RequestEntry) -> Bool {
        let key = Key(userKey: userKey, requestID: entry.requestID)
        guard details[key] == nil, find(key) == nil else { return false }
        record(key, user: UserLane(key: userKey), seq: nil, entry)
        return true
    }

    /// Whether the request's entry is an earlier version's open one or decided failure (it has no
    /// slot yet).
    func isLegacyOpen(_ key: Key) -> Bool { details[key].map { $0.seq == nil && !$0.onlyForRange } ?? false }

    /// Forgets the results last touched before `horizonMs` (the dedupe retention), and users with
    /// nothing left; an open intent stays however old (only a recovery call may ask billing about
    /// it again). Whether it forgot anything.
    @discardableResult
    mutating func prune(untouchedBefore horizonMs: Int64) -> Bool {
        let before = count
        for position in settled.indices where !settled[position].isFree && settled[position].completedAtMs < horizonMs {
            remove(at: position)
        }
        details = details.filter { $0.value.entry.result == nil || $0.value.entry.lastTouchedMs >= horizonMs }
        // The rings let go of the entries that went; a user with neither entry nor detail goes.
        var live = Set<Int32>()
        for user in users.indices {
            for slot in users[user].ring.indices where users[user].ring[slot] >= 0 {
                if settled[Int(users[user].ring[slot])].isFree {
                    users[user].ring[slot] = -1
                } else {
                    live.insert(Int32(user))
                }
            }
        }
        for detail in details.values where detail.user >= 0 { live.insert(detail.user) }
        for (id, user) in userIDs where !live.contains(user) {
            userIDs[id] = nil
            users[Int(user)] = User(key: "")
            freeUsers.append(user)
        }
        compactIfSparse()
        return count < before
    }

    /// The user's lane as this memory keeps it, when it knows the user: its key shares the kept
    /// key's storage, so the lookups that follow (the memory's, the lane scheduler's, the output
    /// tracker's) compare the two keys by identity instead of byte by byte.
    func canonical(_ lane: UserLane) -> UserLane {
        guard let index = userIDs.index(forKey: lane) else { return lane }
        return userIDs.keys[index]
    }

    /// Whether the user has a request in flight or in doubt.
    func hasOpenRequest(ofUser userKey: String) -> Bool {
        userIDs[UserLane(key: userKey)].map { users[Int($0)].openRequests > 0 } ?? false
    }

    /// Forgets everything of the user (kept in the state store, read back when needed).
    mutating func forget(userKey: String) {
        let lane = UserLane(key: userKey)
        guard let user = userIDs[lane] else { return }
        for position in users[Int(user)].ring where position >= 0 { remove(at: Int(position)) }
        // (Its details left with its settled entries, but open requests', which a user let go has none of.)
        if users[Int(user)].openRequests > 0 {
            for (key, detail) in details where detail.user == user { setDetail(key, nil) }
        }
        userIDs[lane] = nil
        users[Int(user)] = User(key: "")
        freeUsers.append(user)
    }

    // MARK: Internals

    /// Sets or removes a request's whole entry, counting its user's open requests.
    private mutating func setDetail(_ key: Key, _ detail: Detail?) {
        if let old = details[key], old.entry.result == nil {
            openDetails -= 1
            if old.user >= 0 { users[Int(old.user)].openRequests -= 1 }
        }
        details[key] = detail
        if let detail, detail.entry.result == nil {
            openDetails += 1
            if detail.user >= 0 { users[Int(detail.user)].openRequests += 1 }
        }
    }

    private mutating func intern(_ lane: UserLane) -> Int32 {
        if let user = userIDs[lane] { return user }
        let user: Int32
        if let free = freeUsers.popLast() {
            user = free
            users[Int(free)] = User(key: lane.key)
        } else {
            user = Int32(users.count)
            users.append(User(key: lane.key))
        }
        userIDs[lane] = user
        return user
    }

    /// The offset's code in a settled entry (never 0), or `nil` when it is too far from the base.
    private mutating func code(offset: Int64) -> Int64? {
        let base = offsetBase ?? offset
        offsetBase = base
        let (distance, overflow) = offset.subtractingReportingOverflow(base)
        let half = Settled.offsetCodeLimit / 2
        guard !overflow, distance > -half, distance < half else { return nil }
        return distance + half
    }

    private func offset(decoding code: Int64) -> Int64? {
        guard code != 0, let offsetBase else { return nil }
        return offsetBase + code - Settled.offsetCodeLimit / 2
    }

    private var positionMask: UInt32 { UInt32(truncatingIfNeeded: (1 << positionBits) - 1) }
    /// The distance a bucket stores for any distance from this one on (then its home is read from
    /// the table).
    private var farthest: UInt32 { UInt32(truncatingIfNeeded: (1 << (32 - positionBits)) - 1) }

    private func home(_ key: Key) -> Int {
        Int(truncatingIfNeeded: ((key.low & 0xffff_ffff) &* UInt64(index.count)) >> 32)
    }

    private func bucketWord(position: Int, distance: Int) -> UInt32 {
        UInt32(min(distance, Int(farthest))) << positionBits | UInt32(position + 1)
    }

    private func position(in word: UInt32) -> Int { Int(word & positionMask) - 1 }

    private func following(_ bucket: Int) -> Int { bucket + 1 == index.count ? 0 : bucket + 1 }

    /// The home of the entry in the (occupied) bucket.
    private func home(ofBucket bucket: Int) -> Int {
        let word = index[bucket]
        let distance = word >> positionBits
        if distance == farthest { return home(settled[position(in: word)].key) }
        let home = bucket - Int(distance)
        return home < 0 ? home + index.count : home
    }

    private func find(_ key: Key) -> Int? {
        var bucket = home(key)
        var distance: UInt32 = 0
        while true {
            let word = index[bucket]
            if word == 0 { return nil }
            // (Only an entry with the same home can be the key's.)
            if word >> positionBits == distance, settled[position(in: word)].key == key { return position(in: word) }
            bucket = following(bucket)
            if distance < farthest { distance += 1 }
        }
    }

    /// The bucket holding `position`.
    private func bucket(of position: Int) -> Int {
        var bucket = home(settled[position].key)
        let word = UInt32(position + 1)
        while index[bucket] & positionMask != word { bucket = following(bucket) }
        return bucket
    }

    /// Puts `entry` in a free slot, or a new one, and indexes it: its position.
    private mutating func insert(_ entry: Settled) -> Int32 {
        let position: Int32
        if let free = freeSlots.popLast() {
            position = free
            settled[Int(free)] = entry
        } else {
            position = Int32(settled.count)
            settled.append(entry)
        }
        if settledCount * 5 > index.count * 4 {
            rebuildIndex(buckets: settledCount * 5 / 3)
        } else if settled.count > Int(positionMask) {
            rebuildIndex(buckets: index.count)
        } else {
            place(position)
        }
        return position
    }

    private mutating func place(_ position: Int32) {
        var bucket = home(settled[Int(position)].key)
        var distance = 0
        while index[bucket] != 0 {
            bucket = following(bucket)
            distance += 1
        }
        index[bucket] = bucketWord(position: Int(position), distance: distance)
    }

    /// Indexes every settled entry anew in `buckets` buckets (at least 16), with room for
    /// positions up to twice the table's slots.
    private mutating func rebuildIndex(buckets: Int) {
        let positions = settled.count * 2 + 1
        positionBits = min(32, max(leastPositionBits, positions.bitWidth - positions.leadingZeroBitCount))
        index = Array(repeating: 0, count: max(16, buckets))
        for position in settled.indices where !settled[position].isFree { place(Int32(position)) }
    }

    /// Removes the settled entry at `position` (and its whole copy): the index closes its gap by
    /// shifting back (no tombstones), and its slot is free. A ring pointing at it is the caller's.
    private mutating func remove(at position: Int) {
        // (A ring or index left on a free slot is a bug that would forget requests: stop, never guess.)
        precondition(!settled[position].isFree, "RequestMemory: slot \(position) removed twice")
        let removed = settled[position]
        setDetail(removed.key, nil)
        var gap = bucket(of: position)
        var next = gap
        while true {
            next = following(next)
            let occupant = index[next]
            if occupant == 0 { break }
            let wanted = home(ofBucket: next)
            // An entry stays when its home lies cyclically in (gap, next].
            let stays = gap <= next ? (gap < wanted && wanted <= next) : (gap < wanted || wanted <= next)
            if stays { continue }
            let distance = gap - wanted
            index[gap] = bucketWord(
                position: self.position(in: occupant), distance: distance < 0 ? distance + index.count : distance)
            gap = next
        }
        index[gap] = 0
        settled[position].free()
        freeSlots.append(Int32(position))
    }

    /// After a prune that freed more than a quarter of the table (and a chunk), the entries past
    /// the live count move into the free slots below it and the table's tail is let go, and the
    /// index shrinks with it: a partition that shrank gives its memory back.
    private mutating func compactIfSparse() {
        guard freeSlots.count > settled.chunkCapacity, freeSlots.count * 4 > settled.count else { return }
        let live = settledCount
        var holes = freeSlots.filter { $0 < live }
        var moved: [Int32: Int32] = [:]
        for position in live..<settled.count where !settled[position].isFree {
            let hole = holes.removeLast()
            let bucket = bucket(of: position)
            index[bucket] = index[bucket] & ~positionMask | UInt32(hole + 1)
            settled[Int(hole)] = settled[position]
            moved[Int32(position)] = hole
        }
        for user in users.indices {
            for slot in users[user].ring.indices where users[user].ring[slot] >= Int32(live) {
                users[user].ring[slot] = moved[users[user].ring[slot]]!
            }
        }
        while settled.count > live { settled.removeLast() }
        freeSlots = []
        // The index shrinks with the table, to 60% full.
        let buckets = max(16, live * 5 / 3)
        if buckets < index.count { rebuildIndex(buckets: buckets) }
    }

    /// The results in the order of the index a settled entry keeps of its own (built once:
    /// `allCases` builds an array on each use).
    fileprivate static let results = OutcomeResult.allCases

    /// A result's index in the bits a settled entry keeps of it (found by comparing cases, not by
    /// hashing the raw value as a dictionary of results would).
    private static func index(of result: OutcomeResult) -> Int { results.firstIndex(of: result) ?? 0 }

    private static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
