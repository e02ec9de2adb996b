import EncoreEvents
import Foundation
import Kafka
import Testing

@testable import EncoreProcessor

/// The state store alone (RocksDB in a temporary directory): checkpoints written with their
/// records, partitions kept apart, and a store of another changelog dropped at open.
@Suite("State store")
struct StateStoreUnitTests {
    private func open(_ path: String, group: String = "g", topic: String = "state") throws -> StateStore {
        try StateStore(
            directory: path, group: group, stateTopic: topic, cacheBytes: 1 << 20, writeBufferBytes: 4 << 20,
            logger: Logger(label: "test"))
    }

    private func records(_ store: StateStore, _ partition: Int32) throws -> [String: String] {
        var found: [String: String] = [:]
        try store.forEachRecord(of: partition) { key, value in
            found[String(decoding: key, as: UTF8.self)] = String(decoding: value, as: UTF8.self)
        }
        return found
    }

    /// A user's state record with one grant expiring at `expiresAtMs` (none: no expiry).
    private func state(_ user: String, expiresAtMs: Int64?) -> (key: [UInt8]?, value: [UInt8]) {
        let grant = EntitlementStateRecord.Grant(
            productID: "p", entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days), status: .verified,
            isActive: true, grantedAtMs: 1, expiresAtMs: expiresAtMs, requestID: "r")
        let record = EntitlementStateRecord(appID: "app", appUserID: user, grants: [grant])
        return (Array("app:\(user)".utf8), record.jsonBytes())
    }

    /// A user's journal record of request `seq`, open (an intent) or answered.
    private func journal(_ user: String, seq: Int64, open: Bool) -> (key: [UInt8]?, value: [UInt8]) {
        let entry = EntitlementStateRecord.RequestEntry(
            requestID: "r\(seq)", attempts: 1, startedAtMs: 5, result: open ? nil : .purchased,
            completedAtMs: open ? nil : 6)
        let record = JournalRecord(appID: "app", appUserID: user, seq: seq, entry: entry)
        return (record.key(slotCount: 100), record.jsonBytes())
    }

    /// The broker's acknowledgement of a changelog record written at `offset`.
    private func delivery(_ key: String, _ value: String, partition: Int32 = 0, offset: Int64) -> KafkaDelivery {
        KafkaDelivery(
            token: 0, error: nil,
            record: KafkaProducerRecord(
                topic: "state", partition: partition, key: Array(key.utf8), value: Array(value.utf8)),
            offset: offset)
    }

    /// 64 random changes of `users` users: expiries set, moved, removed; intents opened and answered
    /// (a few slots per user, so a slot is written again both open and answered).
    private func changes(_ random: inout SplitMix64, users: UInt64) -> [(key: [UInt8]?, value: [UInt8])] {
        (0..<64).map { _ in
            let user = "u\(random.next() % users)"
            switch random.next() % 3 {
            case 0: return state(user, expiresAtMs: random.next() % 4 == 0 ? nil : Int64(random.next() % 1_000))
            default: return journal(user, seq: Int64(random.next() % 3), open: random.next() % 2 == 0)
            }
        }
    }

    /// Partition `partition` holds what `other` holds: records, open requests, expiries.
    private func expectSame(_ store: StateStore, _ partition: Int32, as other: Int32, after moment: String) throws {
        #expect(try records(store, partition) == records(store, other), "records of \(partition) after \(moment)")
        #expect(
            try store.usersWithOpenRequests(of: partition) == store.usersWithOpenRequests(of: other),
            "open requests of \(partition) after \(moment)")
        for through: Int64 in [250, 500, 1_000] {
            #expect(
                try store.dueUsers(of: partition, after: nil, throughMs: through, limit: 1_000).users
                    == store.dueUsers(of: other, after: nil, throughMs: through, limit: 1_000).users,
                "expiries of \(partition) through \(through) after \(moment)")
        }
    }

    @Test("records and their checkpoint are kept per partition, the latest value of each key")
    func applyAndRead() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        #expect(try store.checkpoint(of: 0) == nil)
        let checkpoint = StateStore.Checkpoint(offset: 3, lastDigest: 42)
        try store.apply(
            [
                (Array("a".utf8), Array("1".utf8)), (Array("b".utf8), Array("2".utf8)),
                (Array("a".utf8), Array("3".utf8)),
            ],
            partition: 0, checkpoint: checkpoint)
        try store.apply(
            [(Array("a".utf8), Array("other".utf8))], partition: 1, checkpoint: .init(offset: 1, lastDigest: 7))
        #expect(try store.checkpoint(of: 0) == checkpoint)
        #expect(try records(store, 0) == ["a": "3", "b": "2"])
        #expect(try records(store, 1) == ["a": "other"])
        try store.reset(partition: 0)
        #expect(try store.checkpoint(of: 0) == nil && records(store, 0).isEmpty)
        #expect(try records(store, 1) == ["a": "other"])
    }

    @Test(
        "a user's records are read back together with their changelog keys; open requests and expiries are indexed as the records change"
    )
    func usersAndIndexes() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        let checkpoint = StateStore.Checkpoint(offset: 1, lastDigest: 0)
        // "a" and "ab": one user's key is a prefix of the other's; their records stay apart.
        try store.apply(
            [
                state("a", expiresAtMs: 300), journal("a", seq: 0, open: true), journal("a", seq: 1, open: false),
                state("ab", expiresAtMs: 100), journal("ab", seq: 0, open: false), state("c", expiresAtMs: nil),
            ], partition: 0, checkpoint: checkpoint)
        let a = try store.records(ofUser: "app:a", partition: 0).map { String(decoding: $0.key, as: UTF8.self) }
        #expect(a == ["app:a", ":0:app:a", ":1:app:a"])
        #expect(try store.records(ofUser: "app:ab", partition: 0).count == 2)
        #expect(try store.records(ofUser: "app:a", partition: 1).isEmpty)
        #expect(try store.usersWithOpenRequests(of: 0) == ["app:a"])
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 1_000, limit: 10).users == ["app:ab", "app:a"])
        let first = try store.dueUsers(of: 0, after: nil, throughMs: 1_000, limit: 1)
        #expect(first.users == ["app:ab"])
        #expect(try store.dueUsers(of: 0, after: first.cursor, throughMs: 1_000, limit: 10).users == ["app:a"])
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 200, limit: 10).users == ["app:ab"])

        // The intent settled, "ab"'s expiry moved twice in one batch, "a"'s gone.
        try store.apply(
            [
                journal("a", seq: 0, open: false), state("ab", expiresAtMs: 500), state("ab", expiresAtMs: 400),
                state("a", expiresAtMs: nil),
            ], partition: 0, checkpoint: checkpoint)
        #expect(try store.usersWithOpenRequests(of: 0).isEmpty)
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 1_000, limit: 10).users == ["app:ab"])
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 399, limit: 10).users.isEmpty)
        // forEachRecord gives the changelog's keys back.
        #expect(try Set(records(store, 0).keys) == ["app:a", ":0:app:a", ":1:app:a", "app:ab", ":0:app:ab", "app:c"])
    }

    @Test(
        "a rebuild (the partition reset, written without the log, deleting only the index entries it wrote) leaves the store an ordinary write leaves, also for the writes after it"
    )
    func rebuildMatchesOrdinaryWrites() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        var random = SplitMix64(seed: 30)
        func batch() -> [(key: [UInt8]?, value: [UInt8])] { changes(&random, users: 40) }
        func same(_ moment: String) throws { try expectSame(store, 1, as: 0, after: moment) }
        // Partition 1 held other users' records, open intents and expiries: the reset must clear
        // them all, as the rebuild writes on the belief that only its own entries exist.
        try store.apply(
            [state("u1", expiresAtMs: 100), journal("u1", seq: 0, open: true), state("old", expiresAtMs: 50)],
            partition: 1, checkpoint: .init(offset: 3, lastDigest: 0))
        try store.reset(partition: 1)
        // As a large rebuild runs: RocksDB's compactions paused, then the partition compacted once.
        try store.pauseCompactions()
        var rebuild: StateStore.Rebuild? = StateStore.Rebuild(records: 64 * 30)
        for offset in 1...30 {
            let records = batch()
            let checkpoint = StateStore.Checkpoint(offset: Int64(offset * 64), lastDigest: 0)
            try store.apply(records, partition: 0, checkpoint: checkpoint)
            try store.apply(records, partition: 1, checkpoint: checkpoint, synced: false, rebuild: &rebuild)
        }
        try store.finishRebuilds()
        try store.resumeCompactions(after: [1])
        #expect(try store.usersWithOpenRequests(of: 0).count > 5, "the changes leave intents open")
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 1_000, limit: 1_000).users.count > 20)
        try same("the rebuild")
        // The writes after it (the processor's own) find the indexes the rebuild left.
        for offset in 31...40 {
            let records = batch()
            let checkpoint = StateStore.Checkpoint(offset: Int64(offset * 64), lastDigest: 0)
            try store.apply(records, partition: 0, checkpoint: checkpoint)
            try store.apply(records, partition: 1, checkpoint: checkpoint)
        }
        try same("the writes after it")
    }

    @Test(
        "batches written on the batch writer's thread, a rebuild's and a tail's, leave what direct writes leave: a batch's index reads what the batches queued before it wrote"
    )
    func batchWriterMatchesDirectWrites() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        var random = SplitMix64(seed: 31)
        // A few users, so that nearly every batch changes the expiry a batch before it set.
        func batch() -> [(key: [UInt8]?, value: [UInt8])] { changes(&random, users: 12) }
        // A writer behind the batches' building, so that a batch built without waiting for the
        // ones before it to be written reads the expiries they replace as they were before them.
        let writer = StateStore.BatchWriter(store, lag: .milliseconds(2))
        defer { writer.finish() }
        var rebuild: StateStore.Rebuild? = StateStore.Rebuild(records: 64 * 40)
        var tail: StateStore.Rebuild? = nil
        for offset in 1...40 {
            let records = batch()
            let checkpoint = StateStore.Checkpoint(offset: Int64(offset * 64), lastDigest: 0)
            try store.apply(records, partition: 0, checkpoint: checkpoint)
            try store.apply(records, partition: 1, checkpoint: checkpoint, rebuild: &rebuild, through: writer)
            try store.apply(records, partition: 2, checkpoint: checkpoint, rebuild: &tail, through: writer)
        }
        try writer.drain()
        try store.finishRebuilds()
        #expect(try store.dueUsers(of: 0, after: nil, throughMs: 1_000, limit: 1_000).users.count > 5)
        for partition: Int32 in [1, 2] {
            #expect(try store.checkpoint(of: partition) == store.checkpoint(of: 0))
            try expectSame(store, partition, as: 0, after: "the writes")
        }
    }

    @Test(
        "a write of the batch writer that fails is thrown by the next drain and the next write; nothing of it is written"
    )
    func batchWriterFailure() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        try store.apply([state("u1", expiresAtMs: 5)], partition: 0, checkpoint: .init(offset: 1, lastDigest: 0))
        // The same store opened read-only: RocksDB refuses every write.
        let readOnly = try StateStore.openForReading(directory: path).store
        defer { readOnly.close() }
        let writer = StateStore.BatchWriter(readOnly)
        defer { writer.finish() }
        var none: StateStore.Rebuild? = nil
        try readOnly.apply(
            [journal("u1", seq: 0, open: true)], partition: 0, checkpoint: .init(offset: 2, lastDigest: 0),
            rebuild: &none, through: writer)
        #expect(throws: RocksDBError.self) { try writer.drain() }
        #expect(throws: RocksDBError.self) {
            try readOnly.apply(
                [journal("u1", seq: 1, open: true)], partition: 0, checkpoint: .init(offset: 3, lastDigest: 0),
                rebuild: &none, through: writer)
        }
        #expect(try store.checkpoint(of: 0)?.offset == 1)
        #expect(try store.usersWithOpenRequests(of: 0).isEmpty)
    }

    @Test(
        "an abandoned rebuild leaves nothing of its partition, not even the batches still queued when it was abandoned")
    func abandonedRebuild() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        try store.pauseCompactions()
        // A writer far behind: both batches are still queued when the rebuild is abandoned.
        let writer = StateStore.BatchWriter(store, lag: .milliseconds(50))
        defer { writer.finish() }
        var rebuild: StateStore.Rebuild? = StateStore.Rebuild(records: 2)
        try store.apply(
            [state("u1", expiresAtMs: 5), journal("u1", seq: 0, open: true)], partition: 3,
            checkpoint: .init(offset: 2, lastDigest: 0), rebuild: &rebuild, through: writer)
        try store.apply(
            [state("u2", expiresAtMs: 6)], partition: 3, checkpoint: .init(offset: 3, lastDigest: 0),
            rebuild: &rebuild, through: writer)
        store.abandon(rebuilds: [3], writtenBy: writer, paused: true)
        #expect(try store.checkpoint(of: 3) == nil)
        #expect(try records(store, 3).isEmpty)
        #expect(try store.usersWithOpenRequests(of: 3).isEmpty)
        #expect(try store.dueUsers(of: 3, after: nil, throughMs: 1_000, limit: 10).users.isEmpty)
    }

    @Test("a Bloom filter holds every element inserted; of others it holds none at this load")
    func bloomFilter() {
        var filter = BloomFilter(bits: 1 << 16)
        let inserted = (0..<1_000).map { Array("app:user-\($0)".utf8) }
        for element in inserted { filter.insert(element) }
        #expect(inserted.allSatisfy { filter.mayHold($0) })
        // 1,000 elements in 65,536 bits, four probes: about one false "held" in 75,000 (these
        // elements are fixed, so the count is too).
        #expect((1_000..<2_000).filter { filter.mayHold(Array("app:user-\($0)".utf8)) }.isEmpty)
    }

    @Test("a reopened store keeps what was written; one of another group or topic is emptied")
    func identity() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        do {
            let store = try open(path)
            defer { store.close() }
            try store.apply(
                [(Array("k".utf8), Array("v".utf8))], partition: 2, checkpoint: .init(offset: 5, lastDigest: 1))
        }
        do {
            let store = try open(path)
            defer { store.close() }
            #expect(try store.checkpoint(of: 2)?.offset == 5)
        }
        do {
            let store = try open(path, topic: "another-state")
            defer { store.close() }
            #expect(try store.checkpoint(of: 2) == nil && records(store, 2).isEmpty)
        }
    }

    @Test("a second opening of a directory in use (another instance) is refused with a message naming --state-dir")
    func lockedDirectory() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        #expect {
            _ = try open(path)
        } throws: { error in
            "\(error)".contains("--state-dir") && "\(error)".contains("in use")
        }
    }

    @Test(
        "acknowledged changelog records reach the store with the checkpoint past the last one; exactly-once only once committed"
    )
    func writer() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        let atLeastOnce = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
        atLeastOnce.restored([0])
        atLeastOnce.acknowledged(
            [
                delivery("u", "1", partition: 0, offset: 10),
                KafkaDelivery(token: 1, error: nil, record: nil, offset: 11),
                delivery("u", "2", partition: 0, offset: 12),
            ], worker: 0)
        atLeastOnce.flush()
        #expect(try records(store, 0) == ["u": "2"])
        #expect(
            try store.checkpoint(of: 0)
                == .init(offset: 13, lastDigest: StateStore.digest(key: Array("u".utf8), value: Array("2".utf8))))
        // Stopping closes the store (RocksDB's threads must not outlive the process's end).
        atLeastOnce.stop()

        let reopened = try open(path)
        defer { reopened.close() }
        let exactlyOnce = StateStoreWriter(
            store: reopened, transactional: true, interval: .seconds(60), logger: Logger(label: "test"))
        exactlyOnce.restored([1])
        exactlyOnce.acknowledged([delivery("v", "aborted", partition: 1, offset: 3)], worker: 0)
        exactlyOnce.acknowledged([delivery("w", "committed", partition: 1, offset: 3)], worker: 1)
        exactlyOnce.flush()
        #expect(try records(reopened, 1).isEmpty, "nothing before its transaction commits")
        exactlyOnce.transactionEnded(worker: 0, committed: false)
        exactlyOnce.transactionEnded(worker: 1, committed: true)
        exactlyOnce.flush()
        #expect(try records(reopened, 1) == ["w": "committed"] && reopened.checkpoint(of: 1)?.offset == 4)
        exactlyOnce.stop()
    }

    @Test(
        "records acknowledged before their partition is revoked reach the store (a clean stop leaves nothing to read); those acknowledged after it wait for the next restore"
    )
    func revokedAfterAcknowledged() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        let writer = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
        writer.restored([0])
        writer.acknowledged([delivery("u", "1", offset: 0)], worker: 0)
        writer.revoked([0])
        writer.acknowledged([delivery("u", "2", offset: 1)], worker: 0)
        writer.flush()
        #expect(try records(store, 0) == ["u": "1"] && store.checkpoint(of: 0)?.offset == 1)
        writer.stop()
    }

    @Test(
        "a user read back gets the records acknowledged and not yet in the store (exactly-once, its open transaction's), the newer of two"
    )
    func userReadThroughTheOverlay() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        func read(_ writer: StateStoreWriter) throws -> [String: String] {
            Dictionary(
                uniqueKeysWithValues: try writer.records(ofUser: "app:u", partition: 0).map {
                    (String(decoding: $0.key, as: UTF8.self), String(decoding: $0.value, as: UTF8.self))
                })
        }
        let writer = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
        writer.restored([0])
        writer.acknowledged([delivery("app:u", "1", offset: 0), delivery(":0:app:u", "j", offset: 1)], worker: 0)
        #expect(try read(writer) == ["app:u": "1", ":0:app:u": "j"], "before the flush")
        writer.flush()
        writer.acknowledged([delivery("app:u", "2", offset: 2)], worker: 0)
        #expect(try read(writer) == ["app:u": "2", ":0:app:u": "j"], "the overlay's newer state over the store's")
        writer.flush()
        #expect(try read(writer) == ["app:u": "2", ":0:app:u": "j"], "after the flush, from the store")
        writer.stop()

        let transactional = StateStoreWriter(
            store: try open(path), transactional: true, interval: .seconds(60), logger: Logger(label: "test"))
        transactional.restored([0])
        transactional.acknowledged([delivery("app:u", "3", offset: 3)], worker: 0)
        #expect(try read(transactional)["app:u"] == "3", "the open transaction's record: what the worker knows")
        transactional.transactionEnded(worker: 0, committed: false)
        #expect(try read(transactional)["app:u"] == "2", "aborted: the store's again")
        transactional.stop()
    }

    @Test("a partition no longer owned is dropped after the grace; an owned one never")
    func unownedDropped() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        for partition: Int32 in [0, 1, 2] {
            try store.apply(
                [(Array("k".utf8), Array("v".utf8))], partition: partition, checkpoint: .init(offset: 1, lastDigest: 0))
        }
        #expect(try store.storedPartitions() == [0, 1, 2])
        let writer = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), grace: .seconds(60),
            logger: Logger(label: "test"))
        defer { writer.stop() }
        let start = ContinuousClock.now
        writer.assigned([0, 1])
        writer.revoked([1], now: start)
        writer.sweep(now: start.advanced(by: .seconds(30)))
        #expect(try store.storedPartitions() == [0, 1, 2], "within the grace")
        writer.sweep(now: start.advanced(by: .seconds(120)))
        // 2 was never owned by this process: its grace started at the first sweep.
        #expect(try store.storedPartitions() == [0])
    }

    @Test(
        "no checkpoint passes a record the store lacks: not before the partition is restored, not after a changelog record failed delivery"
    )
    func checkpointNeverPassesAHole() throws {
        let directory = StoreDirectory()
        let path = directory.path
        defer { directory.remove() }
        let store = try open(path)
        defer { store.close() }
        let writer = StateStoreWriter(
            store: store, transactional: false, interval: .seconds(60), logger: Logger(label: "test"))
        defer { writer.stop() }
        func record(_ key: String, partition: Int32) -> KafkaProducerRecord {
            KafkaProducerRecord(topic: "state", partition: partition, key: Array(key.utf8), value: Array("v".utf8))
        }
        // Partition 3 was never restored here: what the store holds of it is not known to be whole.
        writer.acknowledged(
            [KafkaDelivery(token: 0, error: nil, record: record("a", partition: 3), offset: 7)], worker: 0)
        writer.flush()
        #expect(try store.checkpoint(of: 3) == nil)
        // Partition 4: restored, then a record timed out (it may be in the topic at offset 9).
        writer.restored([4])
        writer.acknowledged(
            [KafkaDelivery(token: 1, error: nil, record: record("b", partition: 4), offset: 8)], worker: 0)
        writer.flush()
        #expect(try store.checkpoint(of: 4)?.offset == 9)
        writer.acknowledged(
            [
                KafkaDelivery(
                    token: 2, error: KafkaError(code: .messageTimedOut, message: "timed out"),
                    record: record("c", partition: 4)),
                KafkaDelivery(token: 3, error: nil, record: record("d", partition: 4), offset: 10),
            ], worker: 0)
        writer.flush()
        #expect(try store.checkpoint(of: 4)?.offset == 9, "the checkpoint stays before the record that failed")
        #expect(try records(store, 4) == ["b": "v"])
        // Restored again (from the changelog, past its checkpoint), it takes records again.
        writer.restored([4])
        writer.acknowledged(
            [KafkaDelivery(token: 4, error: nil, record: record("e", partition: 4), offset: 11)], worker: 0)
        writer.flush()
        #expect(try store.checkpoint(of: 4)?.offset == 12)
    }
}
