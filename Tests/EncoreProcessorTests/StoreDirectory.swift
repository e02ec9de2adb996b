import Foundation
import Testing

@testable import EncoreProcessor

/// A state store's temporary directory, removed only once no store in this process has it open.
///
/// Removing the files of an open RocksDB makes its next memtable switch fail (its new log file
/// cannot be created). With a range delete in that memtable, Debian's RocksDB 7.8, built with its
/// assertions on, then aborts the whole test process when the switch is tried again: at the next
/// flush, compaction or close (upstream dropped that assertion: facebook/rocksdb#12796).
struct StoreDirectory {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("encore-store-\(UUID())").path

    /// Removes the directory. A store still open on it (RocksDB's lock held) is a test's mistake:
    /// recorded as an issue, and the directory is left alone.
    func remove(sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            try RocksDB(path: path, cacheBytes: 1 << 20, writeBufferBytes: 1 << 20).close()
        } catch  where error.description.contains("lock") {
            Issue.record(
                "a store still has \(path) open when the test removes it; close it first: \(error)",
                sourceLocation: sourceLocation)
            return
        } catch {}
        try? FileManager.default.removeItem(atPath: path)
    }
}
