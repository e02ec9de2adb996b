import Foundation
import Kafka
import Testing

@testable import EncoreProcessor

/// RocksDB's compactions around a bulk rebuild: its final compaction in the background, writes
/// never stopped by the first level's files meanwhile, the stalls back once it is through.
@Suite("State store compactions")
struct StoreCompactionsTests {
    private func directory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("encore-compactions-\(UUID())").path
    }

    /// Writes `files` first-level files of about 1 MB each (random values: LZ4 leaves them about
    /// that large, so compacting them together takes a while), compactions paused by `pause`.
    private func pileUp(_ db: RocksDB, files: Int, seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        for file in 0..<files {
            let batch = RocksDB.Batch()
            for entry in 0..<256 {
                let value = (0..<512).map { _ in UInt64(random.next()) }.withUnsafeBytes { Array($0) }
                batch.put(Array("key-\(entry)-\(file)".utf8), Array(value.prefix(4096)))
            }
            try db.write(batch, synced: false)
            try db.flush()
        }
    }

    private func writeStopped(_ db: RocksDB) -> Bool { db.property("rocksdb.is-write-stopped") == 1 }

    /// A database in a new directory, with compactions whose background work each waits for a
    /// signal of the gate; closed and removed after `body`.
    private func withGatedCompactions(
        _ body: (RocksDB, StateStore.Compactions, DispatchSemaphore) throws -> Void
    ) throws {
        let path = directory()
        defer { RocksDB.destroy(path: path) }
        let db = try RocksDB(path: path, cacheBytes: 1 << 20, writeBufferBytes: 8 << 20)
        let gate = DispatchSemaphore(value: 0)
        let compactions = StateStore.Compactions(db, logger: Logger(label: "test"), gate: gate)
        defer {
            compactions.close()
            db.close()
        }
        try body(db, compactions, gate)
    }

    @Test(
        "a bulk load's compaction runs after resume returns, writes are not stopped by the 40 first-level files meanwhile, and the stalls are back once it is through"
    )
    func backgroundCompaction() throws {
        try withGatedCompactions { db, compactions, gate in try backgroundCompaction(db, compactions, gate) }
    }

    private func backgroundCompaction(
        _ db: RocksDB, _ compactions: StateStore.Compactions, _ gate: DispatchSemaphore
    ) throws {
        try compactions.pause()
        #expect(compactions.settings == (paused: true, relaxed: false))
        try pileUp(db, files: 40, seed: 1)
        #expect(db.firstLevelFiles() == 40)
        try compactions.resume(compacting: ([], [0xff]), what: "test")
        // (Held at the gate: nothing compacted yet but what RocksDB's automatic compactions begin,
        // which take the 40 files together and free none of them before they end.)
        #expect(compactions.settings == (paused: false, relaxed: true))
        #expect(!writeStopped(db), "40 first-level files stop writes at RocksDB's defaults (36)")
        let batch = RocksDB.Batch()
        batch.put(Array("after".utf8), Array("resume".utf8))
        try db.write(batch)
        gate.signal()
        compactions.waitForBackground()
        #expect(compactions.settings == (paused: false, relaxed: false))
        #expect(db.firstLevelFiles() == 0)
        #expect(try db.get(Array("after".utf8)) == Array("resume".utf8))
        #expect(try db.get(Array("key-7-39".utf8))?.count == 4096)
    }

    @Test("a second bulk load keeps compactions paused when the first one ends; they resume with the last")
    func overlappingLoads() throws {
        try withGatedCompactions { _, compactions, gate in try overlappingLoads(compactions, gate) }
    }

    private func overlappingLoads(_ compactions: StateStore.Compactions, _ gate: DispatchSemaphore) throws {
        try compactions.pause()
        try compactions.pause()
        try compactions.resume(compacting: ([], [0x80]), what: "the first")
        #expect(compactions.settings == (paused: true, relaxed: true))
        try compactions.resume(compacting: ([0x80], [0xff]), what: "the second")
        #expect(compactions.settings == (paused: false, relaxed: true))
        gate.signal()
        gate.signal()
        compactions.waitForBackground()
        #expect(compactions.settings == (paused: false, relaxed: false))
    }

    @Test("closing the store while its background compaction waits stops it and returns; the store opens again whole")
    func closeDuringCompaction() throws {
        let path = directory()
        defer { RocksDB.destroy(path: path) }
        do {
            let db = try RocksDB(path: path, cacheBytes: 1 << 20, writeBufferBytes: 8 << 20)
            let compactions = StateStore.Compactions(
                db, logger: Logger(label: "test"), gate: DispatchSemaphore(value: 0))
            try compactions.pause()
            try pileUp(db, files: 8, seed: 2)
            try compactions.resume(compacting: ([], [0xff]), what: "test")
            let closed = DispatchSemaphore(value: 0)
            Thread {
                compactions.close()
                closed.signal()
            }.start()
            #expect(closed.wait(timeout: .now() + 60) == .success, "close waits for a compaction held at its gate")
            db.close()
        }
        let again = try RocksDB(path: path, cacheBytes: 1 << 20, writeBufferBytes: 8 << 20)
        defer { again.close() }
        #expect(try again.get(Array("key-255-7".utf8))?.count == 4096)
    }

    @Test(
        "closing the store while its background compaction runs stops it there: the first-level files stay as they were, for the next opening"
    )
    func closeStopsARunningCompaction() throws {
        try withGatedCompactions { db, compactions, gate in
            // Two loads: automatic compactions stay off when the first ends, so only the
            // background compaction of the first could take the files away.
            try compactions.pause()
            try compactions.pause()
            try pileUp(db, files: 80, seed: 4)
            try compactions.resume(compacting: ([], [0xff]), what: "test")
            gate.signal()
            let deadline = ContinuousClock.now + .seconds(60)
            while db.property("rocksdb.num-running-compactions") ?? 0 == 0, ContinuousClock.now < deadline {
                usleep(1_000)
            }
            #expect(db.property("rocksdb.num-running-compactions") == 1, "the compaction began")
            compactions.close()
            // (80 files of about 1 MB each: a compaction of them all takes far longer than the stop.)
            #expect(db.firstLevelFiles() == 80, "a compaction run to its end takes the 80 files together")
            #expect(try db.get(Array("key-9-79".utf8))?.count == 4096)
        }
    }

    @Test(
        "a store opened with its first level piled up (a bulk load killed before its compaction) compacts it in the background, writes not stopped"
    )
    func catchUpAtOpen() throws {
        let path = directory()
        defer { RocksDB.destroy(path: path) }
        func open() throws -> StateStore {
            try StateStore(
                directory: path, group: "g", stateTopic: "state", cacheBytes: 1 << 20, writeBufferBytes: 8 << 20,
                logger: Logger(label: "test"))
        }
        do {
            let killed = try open()
            try killed.pauseCompactions()
            try pileUp(killed.db, files: 40, seed: 3)
            killed.close()
        }
        let store = try open()
        defer { store.close() }
        #expect(!writeStopped(store.db), "40 first-level files stop writes at RocksDB's defaults (36)")
        store.compactions.waitForBackground()
        #expect(store.compactions.settings == (paused: false, relaxed: false))
        #expect(store.db.firstLevelFiles() == 0)
    }

    @Test("writes added in key order leave what they leave in the order given: a key's put and delete keep their order")
    func orderedWrites() throws {
        let path = directory()
        defer { RocksDB.destroy(path: path) }
        let db = try RocksDB(path: path, cacheBytes: 1 << 20, writeBufferBytes: 8 << 20)
        defer { db.close() }
        func key(_ text: String) -> [UInt8] { Array(text.utf8) }
        var writes = RocksDB.OrderedWrites()
        writes.put(key("b"), key("1"))
        writes.delete(key("b"))
        writes.put(key("a"), key("2"))
        writes.delete(key("c"))
        writes.put(key("c"), key("3"))
        writes.put(key("ab"), key("4"))
        writes.put(key("a"), key("5"))
        // Enough writes, of few keys, for the sort to be more than an insertion sort.
        var expected: [String: String] = [:]
        for index in 0..<200 {
            let name = "k\(index % 6)"
            if index % 7 == 3 {
                writes.delete(key(name))
                expected[name] = nil
            } else {
                writes.put(key(name), key("\(index)"))
                expected[name] = "\(index)"
            }
        }
        let batch = RocksDB.Batch()
        writes.add(to: batch)
        try db.write(batch)
        for index in 0..<6 {
            #expect(try db.get(key("k\(index)")) == expected["k\(index)"].map(key), "k\(index)")
        }
        #expect(try db.get(key("a")) == key("5"))
        #expect(try db.get(key("ab")) == key("4"))
        #expect(try db.get(key("b")) == nil)
        #expect(try db.get(key("c")) == key("3"))
        #expect(RocksDB.OrderedWrites.compare(key("a"), key("ab")) < 0)
        #expect(RocksDB.OrderedWrites.compare(key("b"), key("ab")) > 0)
        #expect(RocksDB.OrderedWrites.compare([], key("a")) < 0)
        #expect(RocksDB.OrderedWrites.compare([0xff], [0x01, 0x02]) > 0)
    }

    @Test(
        "the store's keys keep their bytes (a store on disk is read with them): partition, tag, user length and user, expiry"
    )
    func keyBytes() {
        let user = Array("ab".utf8)
        let prefix: [UInt8] = [0x01, 0x00, 0x00, 0x00, 0x03]
        let userTail: [UInt8] = [0x00, 0x00, 0x00, 0x02, 0x61, 0x62]
        #expect(StateStore.partitionPrefix(3) == prefix)
        #expect(StateStore.partitionPrefix(-2) == [0x01, 0xff, 0xff, 0xff, 0xfe])
        #expect(StateStore.checkpointKey(3) == prefix + [0x00])
        #expect(StateStore.userPrefix(3, tag: 0x01, user: user) == prefix + [0x01] + userTail)
        #expect(
            StateStore.recordKey(3, user: user, changelogKey: Array(":0:ab".utf8), isJournal: true)
                == prefix + [0x01] + userTail + [0x01] + Array(":0:ab".utf8))
        #expect(
            StateStore.recordKey(3, user: user, changelogKey: user, isJournal: false)
                == prefix + [0x01] + userTail + [0x00])
        #expect(
            StateStore.openIndexKey(3, user: user, changelogKey: Array("k".utf8))
                == prefix + [0x02] + userTail + Array("k".utf8))
        // The expiry with its sign bit flipped, so that keys sort as the numbers do.
        #expect(
            StateStore.expiryKey(3, at: 0x0102_0304_0506_0708, user: user)
                == prefix + [0x03, 0x81, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08] + userTail)
        #expect(
            StateStore.expiryKey(3, at: -1, user: user)
                == prefix + [0x03, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff] + userTail)
        #expect(StateStore.expiryOfKey(3, user: user) == prefix + [0x04] + userTail)
    }
}
