import CRocksDB
import Foundation
import Synchronization

/// What a RocksDB call reported.
struct RocksDBError: Error, CustomStringConvertible {
    let description: String
}

/// One RocksDB database, through its C API: what the local state store needs (batched atomic
/// writes, point reads, ordered scans, range deletes), with its memory bounded by the block cache
/// and the write buffers.
///
/// `@unchecked Sendable`: RocksDB's `DB` is safe for concurrent reads, writes and iterators from
/// any thread; the handles and options here are immutable after `init` and destroyed only by
/// ``close()`` or `deinit`, which its owner calls once nothing uses the database any more.
final class RocksDB: @unchecked Sendable {
    private let closed = Atomic<Bool>(false)
    private let db: OpaquePointer
    private let options: OpaquePointer
    private let tableOptions: OpaquePointer
    private let cache: OpaquePointer
    private let syncWrite: OpaquePointer
    /// Writes to the log without waiting for the disk (``write(_:synced:logged:)``).
    private let logWrite: OpaquePointer
    /// Writes to the memtables only, not the log (``write(_:synced:logged:)``).
    private let unloggedWrite: OpaquePointer
    private let read: OpaquePointer
    let path: String

    /// Opens (creating when missing) the database at `path`. `cacheBytes` bounds the block cache
    /// (which also holds the index and filter blocks); `writeBufferBytes` bounds all memtables.
    /// `readOnly`: an existing database as it is now (its write-ahead log read, not replayed into
    /// its files), without its lock: a running writer may hold it; nothing is written.
    init(path: String, cacheBytes: Int, writeBufferBytes: Int, readOnly: Bool = false) throws(RocksDBError) {
        self.path = path
        options = rocksdb_options_create()
        rocksdb_options_set_create_if_missing(options, readOnly ? 0 : 1)
        rocksdb_options_set_max_background_jobs(options, 2)
        // A compaction from the first level (a bulk rebuild's final one, above all) is split over
        // two threads: when a rebuild's reading is over, the machine's second core is idle.
        rocksdb_options_set_max_subcompactions(options, 2)
        rocksdb_options_set_compression(options, Int32(rocksdb_lz4_compression))
        // Memory: the memtables of the one column family, bounded together.
        rocksdb_options_set_write_buffer_size(options, max(writeBufferBytes / 4, 1 << 20))
        rocksdb_options_set_max_write_buffer_number(options, 4)
        rocksdb_options_set_db_write_buffer_size(options, max(writeBufferBytes, 4 << 20))
        // (The default skip-list memtable: users are read while records are written, and a state
        // record's write reads the user's indexed expiry. A vector memtable, faster for writes
        // alone, sorts itself at each read: a restore through it took minutes for 40,000 records.)
        rocksdb_options_set_max_open_files(options, 256)
        rocksdb_options_set_keep_log_file_num(options, 2)
        // INFO logs are RocksDB's own LOG files in the directory: warnings only.
        rocksdb_options_set_info_log_level(options, 2)
        // A torn last WAL record (a kill mid-write) is dropped; what was synced is kept.
        rocksdb_options_set_wal_recovery_mode(options, 2)
        rocksdb_options_set_paranoid_checks(options, 1)
        tableOptions = rocksdb_block_based_options_create()
        // Four shards, not RocksDB's default of one per MiB: a file's index and filter blocks
        // (about 0.3 MB each) were pushed out of 1 MB shards and read again on every lookup
        // (measured: 1,245 random reads/s against 66,000-73,000 with 4 shards, 64 MB cache).
        let cacheOptions = rocksdb_lru_cache_options_create()
        rocksdb_lru_cache_options_set_capacity(cacheOptions, max(cacheBytes, 1 << 20))
        rocksdb_lru_cache_options_set_num_shard_bits(cacheOptions, 2)
        cache = rocksdb_cache_create_lru_opts(cacheOptions)
        rocksdb_lru_cache_options_destroy(cacheOptions)
        rocksdb_block_based_options_set_block_cache(tableOptions, cache)
        rocksdb_block_based_options_set_cache_index_and_filter_blocks(tableOptions, 1)
        rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(tableOptions, 1)
        rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(tableOptions, 1)
        rocksdb_block_based_options_set_filter_policy(tableOptions, rocksdb_filterpolicy_create_bloom(10))
        rocksdb_options_set_block_based_table_factory(options, tableOptions)
        syncWrite = rocksdb_writeoptions_create()
        rocksdb_writeoptions_set_sync(syncWrite, 1)
        logWrite = rocksdb_writeoptions_create()
        unloggedWrite = rocksdb_writeoptions_create()
        rocksdb_writeoptions_disable_WAL(unloggedWrite, 1)
        read = rocksdb_readoptions_create()
        var error: UnsafeMutablePointer<CChar>? = nil
        let opened =
            readOnly ? rocksdb_open_for_read_only(options, path, 0, &error) : rocksdb_open(options, path, &error)
        if let failure = Self.take(error) {
            rocksdb_readoptions_destroy(read)
            rocksdb_writeoptions_destroy(syncWrite)
            rocksdb_writeoptions_destroy(logWrite)
            rocksdb_writeoptions_destroy(unloggedWrite)
            rocksdb_options_destroy(options)
            rocksdb_block_based_options_destroy(tableOptions)
            rocksdb_cache_destroy(cache)
            throw RocksDBError(description: "cannot open RocksDB at \(path): \(failure)")
        }
        db = opened!
    }

    /// Closes the database: its background threads stop and its files are released. Before the
    /// process exits: RocksDB's threads must not outlive its static state. Nothing may use the
    /// database after.
    func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        rocksdb_close(db)
    }

    deinit {
        close()
        rocksdb_readoptions_destroy(read)
        rocksdb_writeoptions_destroy(syncWrite)
        rocksdb_writeoptions_destroy(logWrite)
        rocksdb_writeoptions_destroy(unloggedWrite)
        rocksdb_options_destroy(options)
        rocksdb_block_based_options_destroy(tableOptions)
        rocksdb_cache_destroy(cache)
    }

    /// Removes the database at `path` and its files.
    static func destroy(path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }

    /// The value of `key`, if any.
    func get(_ key: [UInt8]) throws(RocksDBError) -> [UInt8]? {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        var length = 0
        var error: UnsafeMutablePointer<CChar>? = nil
        let value = key.withUnsafeBufferPointer { key in
            key.withMemoryRebound(to: CChar.self) {
                rocksdb_get(db, read, $0.baseAddress, key.count, &length, &error)
            }
        }
        if let failure = Self.take(error) { throw RocksDBError(description: "read failed: \(failure)") }
        guard let value else { return nil }
        defer { rocksdb_free(value) }
        return Array(UnsafeRawBufferPointer(start: value, count: length))
    }

    /// Writes `batch` atomically and durably (the write-ahead log synced before it returns): after
    /// any crash, all of it is there or none.
    ///
    /// `synced: false`: written to the log, not waited for on the disk (a crash of the process
    /// loses nothing; one of the machine may lose the log's tail, whole batches from the last on, as
    /// the log is a sequence); ``syncLog()`` then makes it durable.
    ///
    /// `logged: false`: to the memtables only, not the log: a crash of the process loses it unless
    /// ``flush()`` wrote it to the files first (memtables are flushed in the order of their writes,
    /// so what survives of the unlogged writes is those up to some point, beside every logged one).
    func write(_ batch: Batch, synced: Bool = true, logged: Bool = true) throws(RocksDBError) {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        var error: UnsafeMutablePointer<CChar>? = nil
        rocksdb_write(db, !logged ? unloggedWrite : synced ? syncWrite : logWrite, batch.handle, &error)
        if let failure = Self.take(error) { throw RocksDBError(description: "write failed: \(failure)") }
    }

    /// An integer property of the database (`rocksdb.block-cache-usage`...), `nil` when unknown.
    func property(_ name: String) -> UInt64? {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        var value: UInt64 = 0
        return name.withCString { rocksdb_property_int(db, $0, &value) } == 0 ? value : nil
    }

    /// Waits until every write so far is on the disk.
    func syncLog() throws(RocksDBError) {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        var error: UnsafeMutablePointer<CChar>? = nil
        rocksdb_flush_wal(db, 1, &error)
        if let failure = Self.take(error) { throw RocksDBError(description: "log sync failed: \(failure)") }
    }

    /// Writes the memtables to the database's files and waits for it: every write so far, logged
    /// or not, is then durable.
    func flush() throws(RocksDBError) {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        let options = rocksdb_flushoptions_create()
        defer { rocksdb_flushoptions_destroy(options) }
        rocksdb_flushoptions_set_wait(options, 1)
        var error: UnsafeMutablePointer<CChar>? = nil
        rocksdb_flush(db, options, &error)
        if let failure = Self.take(error) { throw RocksDBError(description: "flush failed: \(failure)") }
    }

    /// Turns RocksDB's background compactions off or on. Off, files pile up in its first level
    /// without stalling writes (its stalls by the number of those files apply only with them on):
    /// a bulk load, followed by ``compact(from:to:)``.
    func setAutomaticCompactions(_ on: Bool) throws(RocksDBError) {
        try setOptions(["disable_auto_compactions": on ? "false" : "true"])
    }

    /// RocksDB's defaults for the number of first-level files at which writes slow down and stop.
    static let firstLevelStalls = (slowdown: 20, stop: 36)

    /// With `relaxed`, writes never slow down or stop for the number of first-level files (a bulk
    /// load's files waiting for their compaction); without, at RocksDB's defaults.
    func relaxFirstLevelStalls(_ relaxed: Bool) throws(RocksDBError) {
        let (slowdown, stop) = relaxed ? (1 << 30, 1 << 30) : Self.firstLevelStalls
        try setOptions(["level0_slowdown_writes_trigger": "\(slowdown)", "level0_stop_writes_trigger": "\(stop)"])
    }

    /// Sets mutable options of the column family (RocksDB's `SetOptions`).
    private func setOptions(_ options: [String: String]) throws(RocksDBError) {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        let keys = options.keys.map { strdup($0) }
        let values = options.keys.map { strdup(options[$0]!) }
        defer { (keys + values).forEach { free($0) } }
        var error: UnsafeMutablePointer<CChar>? = nil
        var keyPointers = keys.map { UnsafePointer($0) }
        var valuePointers = values.map { UnsafePointer($0) }
        rocksdb_set_options(db, Int32(options.count), &keyPointers, &valuePointers, &error)
        if let failure = Self.take(error) {
            throw RocksDBError(description: "cannot set \(options.keys.sorted().joined(separator: ", ")): \(failure)")
        }
    }

    /// The number of files in the first level (newest, overlapping: each read looks into all).
    func firstLevelFiles() -> Int? {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        guard let value = rocksdb_property_value(db, "rocksdb.num-files-at-level0") else { return nil }
        defer { rocksdb_free(value) }
        return Int(String(cString: value).trimmingCharacters(in: .whitespaces))
    }

    /// Makes manual compactions running now (``compact(from:to:)``) stop soon and any later one
    /// return at once: before ``close()`` while another thread compacts.
    func stopManualCompactions() {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        rocksdb_disable_manual_compaction(db)
    }

    /// Compacts the keys from `start` to `end` (RocksDB takes `end` as inclusive: a key equal to it,
    /// the next range's first, is compacted too) down to the last level, and waits for it. RocksDB's
    /// C API reports no error here: a failed compaction leaves the files as they were.
    func compact(from start: [UInt8], to end: [UInt8]) {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        start.withUnsafeBufferPointer { start in
            end.withUnsafeBufferPointer { end in
                start.withMemoryRebound(to: CChar.self) { start in
                    end.withMemoryRebound(to: CChar.self) { end in
                        rocksdb_compact_range(db, start.baseAddress, start.count, end.baseAddress, end.count)
                    }
                }
            }
        }
    }

    /// Calls `body` with each key and value from `start` (inclusive) to `end` (exclusive), in key
    /// order, until it returns false. The buffers are valid only during the call.
    /// `fillsCache`: the blocks read stay in the block cache (a small read of data read again); a
    /// long scan reads each block once and would only push the useful ones out.
    func scan(
        from start: [UInt8], to end: [UInt8], fillsCache: Bool = false,
        _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
    ) throws {
        precondition(!closed.load(ordering: .acquiring), "RocksDB used after close()")
        let options = rocksdb_readoptions_create()
        defer { rocksdb_readoptions_destroy(options) }
        rocksdb_readoptions_set_fill_cache(options, fillsCache ? 1 : 0)
        try end.withUnsafeBufferPointer { end in
            try end.withMemoryRebound(to: CChar.self) { end in
                rocksdb_readoptions_set_iterate_upper_bound(options, end.baseAddress, end.count)
                let iterator = rocksdb_create_iterator(db, options)
                defer { rocksdb_iter_destroy(iterator) }
                start.withUnsafeBufferPointer { start in
                    start.withMemoryRebound(to: CChar.self) { rocksdb_iter_seek(iterator, $0.baseAddress, start.count) }
                }
                while rocksdb_iter_valid(iterator) != 0 {
                    var keyLength = 0
                    var valueLength = 0
                    let key = rocksdb_iter_key(iterator, &keyLength)
                    let value = rocksdb_iter_value(iterator, &valueLength)
                    let more = try body(
                        UnsafeRawBufferPointer(start: key, count: keyLength),
                        UnsafeRawBufferPointer(start: value, count: valueLength))
                    guard more else { return }
                    rocksdb_iter_next(iterator)
                }
                var error: UnsafeMutablePointer<CChar>? = nil
                rocksdb_iter_get_error(iterator, &error)
                if let failure = Self.take(error) { throw RocksDBError(description: "scan failed: \(failure)") }
            }
        }
    }

    /// Takes the error string RocksDB allocated, if any.
    private static func take(_ error: UnsafeMutablePointer<CChar>?) -> String? {
        guard let error else { return nil }
        defer { rocksdb_free(error) }
        return String(cString: error)
    }

    /// Puts and deletes gathered, then added to a ``Batch`` in key order, those of one key in the
    /// order given (so the batch leaves what it would have in the order given). RocksDB's memtable
    /// inserts keys in order faster: its skip list starts each search where the last one ended,
    /// where a random order searches from the top and compares keys all the way down.
    struct OrderedWrites {
        private var writes: [(key: [UInt8], value: [UInt8]?)] = []

        mutating func put(_ key: [UInt8], _ value: [UInt8]) { writes.append((key, value)) }

        mutating func delete(_ key: [UInt8]) { writes.append((key, nil)) }

        /// Adds the writes to `batch`, in order.
        func add(to batch: Batch) {
            let order = writes.indices.sorted { first, second in
                let order = Self.compare(writes[first].key, writes[second].key)
                return order != 0 ? order < 0 : first < second
            }
            for index in order {
                if let value = writes[index].value {
                    batch.put(writes[index].key, value)
                } else {
                    batch.delete(writes[index].key)
                }
            }
        }

        /// RocksDB's default (bytewise) order: negative, zero or positive.
        static func compare(_ first: [UInt8], _ second: [UInt8]) -> Int {
            let common = min(first.count, second.count)
            let order =
                common == 0
                ? 0
                : first.withUnsafeBytes { first in
                    second.withUnsafeBytes { second in
                        Int(memcmp(first.baseAddress!, second.baseAddress!, common))
                    }
                }
            return order != 0 ? order : first.count - second.count
        }
    }

    /// Writes gathered to be applied together by ``RocksDB/write(_:)``.
    ///
    /// Not `Sendable`: one owner builds and writes it.
    final class Batch {
        let handle: OpaquePointer

        init() { handle = rocksdb_writebatch_create() }

        deinit { rocksdb_writebatch_destroy(handle) }

        func put(_ key: [UInt8], _ value: [UInt8]) {
            key.withUnsafeBufferPointer { key in
                value.withUnsafeBufferPointer { value in
                    key.withMemoryRebound(to: CChar.self) { key in
                        value.withMemoryRebound(to: CChar.self) { value in
                            rocksdb_writebatch_put(handle, key.baseAddress, key.count, value.baseAddress, value.count)
                        }
                    }
                }
            }
        }

        func delete(_ key: [UInt8]) {
            key.withUnsafeBufferPointer { key in
                key.withMemoryRebound(to: CChar.self) { rocksdb_writebatch_delete(handle, $0.baseAddress, key.count) }
            }
        }

        /// Deletes every key from `start` (inclusive) to `end` (exclusive).
        func deleteRange(from start: [UInt8], to end: [UInt8]) {
            start.withUnsafeBufferPointer { start in
                end.withUnsafeBufferPointer { end in
                    start.withMemoryRebound(to: CChar.self) { start in
                        end.withMemoryRebound(to: CChar.self) { end in
                            rocksdb_writebatch_delete_range(
                                handle, start.baseAddress, start.count, end.baseAddress, end.count)
                        }
                    }
                }
            }
        }
    }
}
