import EncoreEvents
import Foundation
import Kafka

/// The local state store (docs/STATE.md): for each changelog partition, the latest record of each
/// changelog key, and the checkpoint: the changelog offset up to which (exclusive) it holds the
/// topic. A cache of the changelog, which stays the truth: whatever it cannot vouch for is dropped
/// and read again from the changelog.
///
/// Keys in the one RocksDB database (`user` is the user key's length, 4 bytes, and its bytes: a
/// user's records are one key range, read in one seek when the user is loaded):
/// - `0x00 "identity"`: the format, group and state topic it was built for;
/// - `0x01 partition(4) 0x00`: the partition's checkpoint (offset, and a digest of the record just
///   before it, to recognise the topic it was read from);
/// - `0x01 partition(4) 0x01 user 0x00`: the user's state record's value, unchanged;
/// - `0x01 partition(4) 0x01 user 0x01 changelog-key`: a journal record's value, unchanged;
/// - `0x01 partition(4) 0x02 user changelog-key`: the record holds an open request (an intent in
///   flight or in doubt): the users a restore loads at once;
/// - `0x01 partition(4) 0x03 expiry(8) user`: the user's earliest expiry (grant or source state);
/// - `0x01 partition(4) 0x04 user`: that expiry, to replace its entry when the state changes;
/// - `0x01 partition(4) 0x05`: where the next restore reads the changelog again from, below the
///   checkpoint (a restore read only to a committed end there: the records between it and the
///   checkpoint that this instance did not write may be missing).
///
/// The indexes are written in the same batch as the records they describe.
final class StateStore: Sendable {
    /// Bumped when the layout changes: a store of another format is rebuilt.
    static let format = 2

    struct Checkpoint: Equatable, Sendable {
        /// The next changelog offset to read: every record before it is in the store.
        var offset: Int64
        /// The FNV-1a digest of the key and value of the record at `offset - 1` (0 at offset 0).
        var lastDigest: UInt64
    }

    let directory: String
    /// The changelog topic the store mirrors.
    let topic: String
    /// (Written by the ``BatchWriter``'s thread too.)
    let db: RocksDB
    /// RocksDB's compactions around bulk rebuilds.
    let compactions: Compactions

    /// Opens the store in `directory` for `group`'s changelog `stateTopic`. One built for another
    /// group, topic or format, or one RocksDB cannot open, is removed and created empty (every
    /// partition is then restored from the changelog).
    init(
        directory: String, group: String, stateTopic: String, cacheBytes: Int, writeBufferBytes: Int, logger: Logger
    ) throws(ProcessorError) {
        self.directory = directory
        self.topic = stateTopic
        let identity = Array("format=\(Self.format)\ngroup=\(group)\ntopic=\(stateTopic)\n".utf8)
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw ProcessorError(.invalidConfiguration, "--state-dir \(directory): cannot create it: \(error)")
        }
        var opened: RocksDB?
        do {
            opened = try RocksDB(path: directory, cacheBytes: cacheBytes, writeBufferBytes: writeBufferBytes)
        } catch  where error.description.contains("While lock file") || error.description.contains("lock hold by") {
            throw ProcessorError(
                .invalidConfiguration,
                "--state-dir \(directory) is in use by another process: give each instance its own state directory")
        } catch {
            logger.warning(
                "the state store in \(directory) cannot be opened (\(error)); rebuilding it from the changelog")
            opened = try Self.recreate(directory, cacheBytes: cacheBytes, writeBufferBytes: writeBufferBytes)
        }
        do {
            let found = try opened!.get(Self.identityKey)
            if let found, found != identity {
                let was = String(decoding: found, as: UTF8.self).split(separator: "\n").joined(separator: ", ")
                logger.warning(
                    "the state store in \(directory) was built for another changelog (\(was)); rebuilding it from '\(stateTopic)'"
                )
                opened = nil  // (closed first: RocksDB locks its directory)
                opened = try Self.recreate(directory, cacheBytes: cacheBytes, writeBufferBytes: writeBufferBytes)
            }
            if found != identity {
                let batch = RocksDB.Batch()
                batch.put(Self.identityKey, identity)
                try opened!.write(batch)
            }
        } catch let error as ProcessorError {
            throw error
        } catch {
            throw ProcessorError(.invalidConfiguration, "--state-dir \(directory): \(error)")
        }
        db = opened!
        compactions = Compactions(db, logger: logger)
        do { try compactions.catchUpIfPiledUp() } catch {
            logger.warning("the state store in \(directory) cannot compact its piled-up first level: \(error)")
        }
    }

    private init(directory: String, topic: String, db: RocksDB) {
        self.directory = directory
        self.topic = topic
        self.db = db
        compactions = Compactions(db, logger: Logger(label: "encore.state"))
    }

    /// Opens the store in `directory` to read it as it is (nothing written, rebuilt or locked: a
    /// running processor may hold it), with the `group` and `topic` it says it was built for.
    static func openForReading(
        directory: String, cacheBytes: Int = 64 << 20
    ) throws(RocksDBError) -> (store: StateStore, format: Int?, group: String?, topic: String?) {
        let db = try RocksDB(path: directory, cacheBytes: cacheBytes, writeBufferBytes: 4 << 20, readOnly: true)
        var fields: [String: String] = [:]
        for line in String(decoding: try db.get(identityKey) ?? [], as: UTF8.self).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        let store = StateStore(directory: directory, topic: fields["topic"] ?? "", db: db)
        return (store, fields["format"].flatMap { Int($0) }, fields["group"], fields["topic"])
    }

    private static func recreate(
        _ directory: String, cacheBytes: Int, writeBufferBytes: Int
    ) throws(ProcessorError) -> RocksDB {
        RocksDB.destroy(path: directory)
        do {
            return try RocksDB(path: directory, cacheBytes: cacheBytes, writeBufferBytes: writeBufferBytes)
        } catch {
            throw ProcessorError(.invalidConfiguration, "--state-dir \(directory): \(error)")
        }
    }

    /// The partition's checkpoint; `nil` when the store holds nothing of it (or an unreadable one).
    func checkpoint(of partition: Int32) throws(RocksDBError) -> Checkpoint? {
        guard let value = try db.get(Self.checkpointKey(partition)), value.count == 16 else { return nil }
        return Checkpoint(offset: Self.int64(value, at: 0), lastDigest: UInt64(bitPattern: Self.int64(value, at: 8)))
    }

    /// Where the next restore of `partition` reads its changelog again from, if a restore read it
    /// only to a committed end short of its end (an open transaction held it): the store may lack
    /// the records from there to its checkpoint that this instance did not write.
    func rereadOffset(of partition: Int32) throws(RocksDBError) -> Int64? {
        guard let value = try db.get(Self.rereadKey(partition)), value.count == 8 else { return nil }
        return Self.int64(value, at: 0)
    }

    /// Sets (or with `nil` removes) where the next restore of `partition` reads its changelog again
    /// from, durably: written before this instance's writes move the checkpoint past it.
    func setRereadOffset(_ offset: Int64?, of partition: Int32) throws(RocksDBError) {
        let batch = RocksDB.Batch()
        if let offset {
            batch.put(Self.rereadKey(partition), Self.bytes(offset))
        } else {
            batch.delete(Self.rereadKey(partition))
        }
        try db.write(batch)
    }

    /// Applies changelog records of `partition` (in offset order) and moves its checkpoint to
    /// `checkpoint`, atomically and durably: after any crash the store holds all of it or none.
    ///
    /// `synced: false` (a restore's batches): not waited for on the disk; ``syncLog()`` at the end.
    /// A machine crash before it may lose the last batches, with their checkpoints: the store is
    /// then at an earlier checkpoint, whole.
    func apply(
        _ records: [(key: [UInt8]?, value: [UInt8])], partition: Int32, checkpoint: Checkpoint, synced: Bool = true
    ) throws(RocksDBError) {
        var none: Rebuild? = nil
        try apply(records, partition: partition, checkpoint: checkpoint, synced: synced, rebuild: &none)
    }

    /// What a rebuild of a partition (its store reset, then its changelog read from the beginning,
    /// nothing else writing it) knows of the index entries it wrote: only those exist, so a delete
    /// of another, or a read of a user's expiry it never wrote, is left out.
    struct Rebuild: Sendable {
        /// The open-request index entries written and not deleted since the reset.
        fileprivate var open: Set<HashedBytes> = []
        /// The users given an expiry since the reset, and others (a Bloom filter: a user it does not
        /// hold has none; one it holds is looked up).
        fileprivate var expiring: BloomFilter

        /// A rebuild of about `records` changelog records: four bits of the filter for each
        /// (between 8 KB and 8 MB), eight or more for each user with a state and a journal record.
        init(records: Int) {
            var bits = 1 << 16
            while bits < records * 4 && bits < 1 << 26 { bits <<= 1 }
            expiring = BloomFilter(bits: bits)
        }
    }

    /// Applies records of `partition` (in offset order) with its checkpoint, atomically: the batch
    /// is whole or absent after any crash. With `rebuild`, without the write-ahead log: a crash of
    /// the process before ``finishRebuilds()`` loses the batches not yet flushed to the store's
    /// files, the newest ones: the partition is then at an earlier checkpoint, whole (memtables
    /// are flushed in the order of their writes), or has none.
    func apply(
        _ records: [(key: [UInt8]?, value: [UInt8])], partition: Int32, checkpoint: Checkpoint, synced: Bool = true,
        rebuild: inout Rebuild?
    ) throws(RocksDBError) {
        let batch = RocksDB.Batch()
        try add(records, partition: partition, checkpoint: checkpoint, to: batch, rebuild: &rebuild)
        try db.write(batch, synced: synced && rebuild == nil, logged: rebuild == nil)
    }

    /// As ``apply(_:partition:checkpoint:synced:rebuild:)`` with `synced: false`, the write left to
    /// `writer`'s thread: the batch is built here (its index entries read what the writes before
    /// it left, once `writer` has written them), and written after those before it.
    func apply(
        _ records: [(key: [UInt8]?, value: [UInt8])], partition: Int32, checkpoint: Checkpoint,
        rebuild: inout Rebuild?, through writer: BatchWriter
    ) throws(RocksDBError) {
        let batch = RocksDB.Batch()
        try add(
            records, partition: partition, checkpoint: checkpoint, to: batch, rebuild: &rebuild,
            beforeRead: writer.drain)
        try writer.write(batch, logged: rebuild == nil)
    }

    /// Leaves nothing of failed rebuilds of `partitions`: once every batch `writer` queued is
    /// written (one written after the reset would outlive it), their keys are deleted by a logged,
    /// synced range delete, and with `paused` compactions resume. Errors are left to the next
    /// restore, which finds no checkpoint or an earlier one.
    func abandon(rebuilds partitions: [Int32], writtenBy writer: BatchWriter, paused: Bool) {
        try? writer.drain()
        for partition in partitions { try? reset(partition: partition) }
        if paused { try? resumeCompactions(after: partitions) }
    }

    /// Makes rebuilds' writes durable (the store's memtables flushed to its files).
    func finishRebuilds() throws(RocksDBError) { try db.flush() }

    /// A bulk rebuild: RocksDB's compactions paused while it loads, then the partitions compacted
    /// once in the background (docs/STATE.md, Restore; ``Compactions``).
    func pauseCompactions() throws(RocksDBError) { try compactions.pause() }

    /// Resumes RocksDB's compactions (once no other bulk rebuild loads) and compacts `partitions`
    /// once, in the background.
    func resumeCompactions(after partitions: [Int32]) throws(RocksDBError) {
        let range = partitions.min().map { first in
            (Self.partitionPrefix(first), Self.partitionPrefix(partitions.max()! &+ 1))
        }
        try compactions.resume(compacting: range, what: "the rebuilt partitions \(partitions.sorted())")
    }

    /// Makes every write so far durable.
    func syncLog() throws(RocksDBError) { try db.syncLog() }

    /// What RocksDB holds in memory and on disk now (outside the Swift heap's accounting).
    struct Usage: Sendable, Equatable {
        /// The block cache's use (data, index and filter blocks; bounded by `--state-cache-mb`).
        var blockCacheBytes: UInt64 = 0
        /// The memtables' (bounded by the write buffers).
        var memtableBytes: UInt64 = 0
        /// The open files' readers outside the block cache.
        var tableReaderBytes: UInt64 = 0
        /// The table files' size on disk.
        var diskBytes: UInt64 = 0
    }

    var usage: Usage {
        Usage(
            blockCacheBytes: db.property("rocksdb.block-cache-usage") ?? 0,
            memtableBytes: db.property("rocksdb.cur-size-all-mem-tables") ?? 0,
            tableReaderBytes: db.property("rocksdb.estimate-table-readers-mem") ?? 0,
            diskBytes: db.property("rocksdb.total-sst-files-size") ?? 0)
    }

    /// Applies several partitions' records and checkpoints in one atomic, synced write.
    func apply(
        _ partitions: [(partition: Int32, records: [(key: [UInt8]?, value: [UInt8])], checkpoint: Checkpoint)],
        synced: Bool = true
    ) throws(RocksDBError) {
        let batch = RocksDB.Batch()
        for (partition, records, checkpoint) in partitions {
            var none: Rebuild? = nil
            try add(records, partition: partition, checkpoint: checkpoint, to: batch, rebuild: &none)
        }
        try db.write(batch, synced: synced)
    }

    /// Adds the records of `partition`, their index entries and the checkpoint to `batch`.
    private func add(
        _ records: [(key: [UInt8]?, value: [UInt8])], partition: Int32, checkpoint: Checkpoint, to batch: RocksDB.Batch,
        rebuild: inout Rebuild?, beforeRead: () throws(RocksDBError) -> Void = {}
    ) throws(RocksDBError) {
        // Each user's expiry as this batch leaves it (a user may be written twice in one).
        var expiries: [HashedBytes: Int64?] = [:]
        // (Added to the batch in key order at the end: RocksDB inserts them faster.)
        var writes = RocksDB.OrderedWrites()
        func index(_ key: [UInt8], open: Bool) {
            if open {
                writes.put(key, [])
                rebuild?.open.insert(HashedBytes(key))
            } else if rebuild == nil || (!rebuild!.open.isEmpty && rebuild!.open.remove(HashedBytes(key)) != nil) {
                writes.delete(key)
            }
        }
        for record in records {
            let key = record.key ?? []
            let (user, isJournal) = Self.user(ofChangelogKey: key)
            writes.put(Self.recordKey(partition, user: user, changelogKey: key, isJournal: isJournal), record.value)
            let open = Self.openIndexKey(partition, user: user, changelogKey: key)
            let expiry: Int64?
            if isJournal {
                index(open, open: Self.journalSummary(record.value).hasOpenRequest)
                continue
            } else if let summary = Self.stateSummary(record.value) {
                // (An earlier version's journal in the state may hold an open request.)
                index(open, open: summary.hasOpenRequest)
                expiry = summary.earliestExpiryMs
            } else {
                expiry = nil
            }
            let was: Int64?
            if let known = expiries[HashedBytes(user)] {
                was = known
            } else if let rebuild, !rebuild.expiring.mayHold(user) {
                was = nil
            } else {
                try beforeRead()
                was = try db.get(Self.expiryOfKey(partition, user: user)).map { Self.int64($0, at: 0) }
            }
            expiries[HashedBytes(user)] = .some(expiry)
            guard was != expiry else { continue }
            if let was { writes.delete(Self.expiryKey(partition, at: was, user: user)) }
            if let expiry {
                writes.put(Self.expiryKey(partition, at: expiry, user: user), [])
                writes.put(Self.expiryOfKey(partition, user: user), Self.bytes(expiry))
                rebuild?.expiring.insert(user)
            } else {
                writes.delete(Self.expiryOfKey(partition, user: user))
            }
        }
        writes.put(Self.checkpointKey(partition), Self.bytes(checkpoint))
        writes.add(to: batch)
    }

    /// Bytes as a set's or dictionary's key, hashed in one call (an array of bytes is hashed byte
    /// by byte: a rebuild's dictionary of users took a tenth of its indexing).
    struct HashedBytes: Hashable, Sendable {
        let bytes: [UInt8]

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        func hash(into hasher: inout Hasher) { bytes.withUnsafeBytes { hasher.combine(bytes: $0) } }
    }

    /// What the indexes need of a journal record: scanned, or decoded where the scan cannot read it
    /// (a record that does not decode is not open).
    static func journalSummary(_ value: [UInt8]) -> ChangelogIndexSummary {
        if let summary = value.withUnsafeBufferPointer(ChangelogIndexSummary.journal) { return summary }
        let entry = try? JournalRecord(jsonBytes: value).entry
        return ChangelogIndexSummary(hasOpenRequest: entry.map { $0.result == nil } ?? false)
    }

    /// What the indexes need of a user's state record: scanned, or decoded where the scan cannot
    /// read it; `nil` for a record that does not decode either.
    static func stateSummary(_ value: [UInt8]) -> ChangelogIndexSummary? {
        if let summary = value.withUnsafeBufferPointer(ChangelogIndexSummary.state) { return summary }
        guard let state = try? EntitlementStateRecord(jsonBytes: value) else { return nil }
        return ChangelogIndexSummary(
            hasOpenRequest: state.journal.entries.contains { $0.result == nil },
            earliestExpiryMs: EntitlementLedger.earliestExpiry(of: state, after: .min))
    }

    /// A user's records in the store, with their changelog keys (the state's first).
    func records(ofUser userKey: String, partition: Int32) throws -> [(key: [UInt8], value: [UInt8])] {
        let user = Array(userKey.utf8)
        let prefix = Self.userPrefix(partition, tag: 0x01, user: user)
        var found: [(key: [UInt8], value: [UInt8])] = []
        try db.scan(from: prefix, to: Self.successor(prefix), fillsCache: true) { key, value in
            found.append((Self.changelogKey(storeKey: key, prefixCount: prefix.count, user: user), Array(value)))
            return true
        }
        return found
    }

    /// The users of `partition` with an open request in the store (in key order, once each).
    func usersWithOpenRequests(of partition: Int32) throws -> [String] {
        let prefix = Self.recordKey(partition, [0x02])
        var users: [String] = []
        try db.scan(from: prefix, to: Self.successor(prefix)) { key, _ in
            guard let user = Self.lengthPrefixed(key, at: prefix.count) else { return true }
            let name = String(decoding: user, as: UTF8.self)
            if users.last != name { users.append(name) }
            return true
        }
        return users
    }

    /// Up to `limit` users of `partition` whose earliest expiry in the store is after `cursor` and
    /// at or before `throughMs`, in expiry order, with the cursor past the last one returned.
    func dueUsers(
        of partition: Int32, after cursor: [UInt8]?, throughMs: Int64, limit: Int
    ) throws -> (users: [String], cursor: [UInt8]?) {
        let prefix = Self.recordKey(partition, [0x03])
        let start = cursor.map { $0 + [0x00] } ?? prefix
        let end = prefix + Self.bytes(Self.orderable(min(throughMs, .max - 1)) &+ 1)
        var users: [String] = []
        var last = cursor
        try db.scan(from: start, to: end, fillsCache: true) { key, _ in
            guard users.count < limit else { return false }
            if let user = Self.lengthPrefixed(key, at: prefix.count + 8) {
                users.append(String(decoding: user, as: UTF8.self))
            }
            last = Array(key)
            return true
        }
        return (users, last)
    }

    /// Forgets everything of `partition`: it is restored from the changelog's beginning next time.
    func reset(partition: Int32) throws(RocksDBError) {
        let batch = RocksDB.Batch()
        batch.deleteRange(from: Self.partitionPrefix(partition), to: Self.partitionPrefix(partition &+ 1))
        try db.write(batch)
    }

    /// Calls `body` with the key and value of each record the store holds for `partition` (in key
    /// order); returns how many.
    @discardableResult
    func forEachRecord(
        of partition: Int32, _ body: ([UInt8], [UInt8]) throws -> Void
    ) throws -> Int {
        let prefix = Self.recordKey(partition, [0x01])
        var count = 0
        try db.scan(from: prefix, to: Self.successor(prefix)) { key, value in
            guard let user = Self.lengthPrefixed(key, at: prefix.count) else { return true }
            let userPrefix = prefix.count + 4 + user.count
            try body(Self.changelogKey(storeKey: key, prefixCount: userPrefix, user: Array(user)), Array(value))
            count += 1
            return true
        }
        return count
    }

    /// The partitions the store holds anything of, in order (a seek per partition).
    func storedPartitions() throws -> [Int32] {
        var found: [Int32] = []
        var from: [UInt8] = [0x01]
        while true {
            var next: Int32? = nil
            try db.scan(from: from, to: [0x02]) { key, _ in
                if key.count >= 5 {
                    next = Int32(
                        bitPattern: UInt32(key[1]) << 24 | UInt32(key[2]) << 16 | UInt32(key[3]) << 8 | UInt32(key[4]))
                }
                return false
            }
            guard let partition = next else { return found }
            found.append(partition)
            guard partition != .max else { return found }
            from = Self.partitionPrefix(partition + 1)
        }
    }

    /// Closes the store (its background compaction stopped, RocksDB's threads too): nothing may
    /// use it after.
    func close() {
        compactions.close()
        db.close()
    }

    /// 64-bit FNV-1a of a record's key and value: which record is just before a checkpoint.
    static func digest(key: [UInt8]?, value: [UInt8]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key ?? [] { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        // (A separator: key "ab" value "c" differs from key "a" value "bc".)
        hash = (hash ^ 0xff) &* 0x100_0000_01b3
        for byte in value { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }

    // MARK: Keys

    private static let identityKey: [UInt8] = [0x00] + Array("identity".utf8)

    static func partitionPrefix(_ partition: Int32) -> [UInt8] { key(partition, capacity: 0) { _ in } }

    /// A key of `partition`: its prefix, then what `body` appends (about `capacity` bytes), built
    /// in one buffer (a rebuild builds several keys per record).
    private static func key(_ partition: Int32, capacity: Int, _ body: (inout [UInt8]) -> Void) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(5 + capacity)
        bytes.append(0x01)
        append32(UInt32(bitPattern: partition), to: &bytes)
        body(&bytes)
        return bytes
    }

    static func checkpointKey(_ partition: Int32) -> [UInt8] { key(partition, capacity: 1) { $0.append(0x00) } }

    private static func rereadKey(_ partition: Int32) -> [UInt8] { key(partition, capacity: 1) { $0.append(0x05) } }

    /// The partition's prefix and `suffix`.
    private static func recordKey(_ partition: Int32, _ suffix: [UInt8]) -> [UInt8] {
        key(partition, capacity: suffix.count) { $0.append(contentsOf: suffix) }
    }

    /// Appends `tag` and the user key with its length.
    private static func appendUser(_ user: [UInt8], tag: UInt8, to bytes: inout [UInt8]) {
        bytes.append(tag)
        append32(UInt32(truncatingIfNeeded: user.count), to: &bytes)
        bytes.append(contentsOf: user)
    }

    /// The partition's prefix, `tag`, and the user key with its length.
    static func userPrefix(_ partition: Int32, tag: UInt8, user: [UInt8]) -> [UInt8] {
        key(partition, capacity: 5 + user.count) { appendUser(user, tag: tag, to: &$0) }
    }

    /// Where a changelog record is kept: under its user, the state first, then the journal's.
    static func recordKey(_ partition: Int32, user: [UInt8], changelogKey: [UInt8], isJournal: Bool) -> [UInt8] {
        key(partition, capacity: 6 + user.count + (isJournal ? changelogKey.count : 0)) { bytes in
            appendUser(user, tag: 0x01, to: &bytes)
            if isJournal {
                bytes.append(0x01)
                bytes.append(contentsOf: changelogKey)
            } else {
                bytes.append(0x00)
            }
        }
    }

    static func openIndexKey(_ partition: Int32, user: [UInt8], changelogKey: [UInt8]) -> [UInt8] {
        key(partition, capacity: 5 + user.count + changelogKey.count) { bytes in
            appendUser(user, tag: 0x02, to: &bytes)
            bytes.append(contentsOf: changelogKey)
        }
    }

    static func expiryKey(_ partition: Int32, at expiry: Int64, user: [UInt8]) -> [UInt8] {
        key(partition, capacity: 13 + user.count) { bytes in
            bytes.append(0x03)
            append64(UInt64(bitPattern: orderable(expiry)), to: &bytes)
            append32(UInt32(truncatingIfNeeded: user.count), to: &bytes)
            bytes.append(contentsOf: user)
        }
    }

    static func expiryOfKey(_ partition: Int32, user: [UInt8]) -> [UInt8] {
        userPrefix(partition, tag: 0x04, user: user)
    }

    /// The user a changelog key belongs to: a journal key's (`:{slot}:{user}`) or the key itself
    /// (a state's).
    static func user(ofChangelogKey key: [UInt8]) -> (user: [UInt8], isJournal: Bool) {
        guard JournalRecord.isJournalKey(key), let colon = key.dropFirst().firstIndex(of: UInt8(ascii: ":")) else {
            return (key, false)
        }
        return (Array(key[(colon + 1)...]), true)
    }

    /// The changelog key of a record kept under `user` (its state's key is the user key).
    private static func changelogKey(storeKey: UnsafeRawBufferPointer, prefixCount: Int, user: [UInt8]) -> [UInt8] {
        guard storeKey.count > prefixCount, storeKey[prefixCount] == 0x01 else { return user }
        return Array(storeKey[(prefixCount + 1)...])
    }

    /// The length-prefixed bytes at `start` of `key`, if whole.
    private static func lengthPrefixed(_ key: UnsafeRawBufferPointer, at start: Int) -> UnsafeRawBufferPointer
        .SubSequence?
    {
        guard key.count >= start + 4 else { return nil }
        let length = Int(
            UInt32(key[start]) << 24 | UInt32(key[start + 1]) << 16 | UInt32(key[start + 2]) << 8
                | UInt32(key[start + 3]))
        guard key.count >= start + 4 + length else { return nil }
        return key[(start + 4)..<(start + 4 + length)]
    }

    /// The first key after every key starting with `prefix`.
    private static func successor(_ prefix: [UInt8]) -> [UInt8] {
        var end = prefix
        while let last = end.last, last == 0xff { end.removeLast() }
        if !end.isEmpty { end[end.count - 1] += 1 }
        return end
    }

    /// A time as an unsigned number that sorts as the signed one does, big-endian.
    private static func orderable(_ value: Int64) -> Int64 { Int64(bitPattern: UInt64(bitPattern: value) ^ (1 << 63)) }

    private static func bytes(_ value: Int64) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(8)
        append64(UInt64(bitPattern: value), to: &bytes)
        return bytes
    }

    /// Appends `value`, most significant byte first (keys sort by it).
    private static func append64(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> shift)) }
    }

    private static func append32(_ value: UInt32, to bytes: inout [UInt8]) {
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> shift)) }
    }

    private static func bytes(_ checkpoint: Checkpoint) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        for value in [UInt64(bitPattern: checkpoint.offset), checkpoint.lastDigest] {
            for shift in stride(from: 56, through: 0, by: -8) {
                bytes.append(UInt8(truncatingIfNeeded: value >> shift))
            }
        }
        return bytes
    }

    private static func int64(_ bytes: [UInt8], at start: Int) -> Int64 {
        var value: UInt64 = 0
        for byte in bytes[start..<start + 8] { value = value << 8 | UInt64(byte) }
        return Int64(bitPattern: value)
    }
}
