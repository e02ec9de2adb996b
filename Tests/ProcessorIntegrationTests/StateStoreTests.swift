import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import TestSupport
import Testing

@testable import EncoreProcessor
@testable import encore_processor

/// The local state store (docs/STATE.md) on the embedded broker: a restart reads the changelog from
/// its checkpoint only, and a store that does not match the changelog is rebuilt from it.
@Suite("The local state store and its checkpoints")
struct StateStoreTests {
    /// Runs a processor with the store in `directory` until the group committed `total` requests;
    /// returns its controller's calls and what its restore read, from `/metrics`.
    private func run(
        bootstrap: String, group: String, directory: String, total: Int64,
        residentUsers: Int? = ProcessorConfiguration.defaultResidentUsers
    ) async throws -> (calls: RecordingController.State, changelog: Int, store: Int, duplicates: Int) {
        let controller = RecordingController()
        let processor = try processor(bootstrap: bootstrap, group: group, maxInFlight: 16, controller: controller) {
            $0.stateDirectory = directory
            $0.residentUsers = residentUsers
        }
        async let running: Void = processor.run()
        let finished = try await eventually(timeout: .seconds(180)) {
            try await committedOffsets(bootstrap: bootstrap, group: group, topic: Topics.requests, partitions: 4)
                .values.reduce(0, +) == total
        }
        let metrics = processor.metrics()
        processor.shutdown()
        try await running
        #expect(finished, "the group did not commit \(total) requests")
        func counter(_ name: String) -> Int {
            metrics.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap {
                Int($0.split(separator: " ")[1])
            } ?? -1
        }
        // RocksDB's memory, outside the heap, is seen, every part: the block cache and memtables in
        // use, the records written in its memtables or files.
        let store = ["block_cache", "memtables", "table_readers"].map {
            counter("encore_state_store_memory_bytes{part=\"\($0)\"}")
        }
        let disk = counter("encore_state_store_disk_bytes")
        #expect(
            store.allSatisfy { $0 >= 0 } && store[0] > 0 && store[1] > 0 && disk >= 0,
            "\(metrics.split(separator: "\n").filter { $0.hasPrefix("encore_state_store") })")
        return (
            controller.snapshot, counter("encore_state_restore_changelog_records_total"),
            counter("encore_state_restore_store_records_total"), processor.statistics.duplicates
        )
    }

    /// Produces `records` again, the same bytes, as an upstream retry would.
    private func resend(_ records: [RequestGenerator.Record], bootstrap: String) async throws {
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        for record in records {
            try producer.produce(KafkaProducerRecord(topic: Topics.requests, key: record.key, value: record.value)) {
                _ in
            }
        }
        try await producer.flush()
        await producer.close()
    }

    private func generated(_ count: Int, seed: UInt64) -> RequestGenerator.Options {
        var options = RequestGenerator.Options()
        options.users = 20
        options.seed = seed
        return options
    }

    @Test(
        "what a restore held past the committed end is read for its journal records, in offset order, past a short end too; states and deletions are left"
    )
    func heldIntentsRead() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        func journal(_ id: String, seq: Int64, attempts: Int, result: OutcomeResult? = nil) -> (
            key: [UInt8], value: [UInt8]
        ) {
            let record = JournalRecord(
                appID: "app", appUserID: "u", seq: seq,
                entry: .init(
                    requestID: id, attempts: attempts, startedAtMs: 5, result: result,
                    completedAtMs: result == nil ? nil : 6))
            return (record.key(slotCount: 100), record.jsonBytes())
        }
        let state = EntitlementStateRecord(appID: "app", appUserID: "u", grants: [])
        let records: [(key: [UInt8], value: [UInt8])] = [
            journal("a", seq: 0, attempts: 1),  // 0: before the held range
            (Array(state.key.utf8), state.jsonBytes()),  // 1
            journal("a", seq: 0, attempts: 2),  // 2
            journal("a", seq: 0, attempts: 2, result: .purchased),  // 3
            (journal("b", seq: 1, attempts: 1).key, []),  // 4: a deletion
            journal("c", seq: 2, attempts: 1),  // 5: past the end the broker reported
        ]
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        for record in records {
            try producer.produce(
                KafkaProducerRecord(topic: Topics.state, partition: 2, key: record.key, value: record.value)
            ) { _ in }
        }
        try await producer.flush()
        await producer.close()
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        configuration.guarantee = .exactlyOnce
        // (That it reads without isolation, past what a read_committed reader sees, needs a broker
        // that holds such a reader: scripts/held_intent_check.py checks it on Tansu.)
        let held = try await PurchaseProcessor.heldJournalRecords(
            [2: 1..<5], configuration: configuration, logger: Logger(label: "test"))
        #expect(held.keys.sorted() == [2])
        #expect(
            held[2]?.map { "\($0.entry.requestID) \($0.entry.attempts) \($0.entry.result?.rawValue ?? "open")" }
                == ["a 2 open", "a 2 purchased", "c 1 open"])
        #expect(
            try await PurchaseProcessor.heldJournalRecords(
                [:], configuration: configuration, logger: Logger(label: "test")
            )
            .isEmpty)
    }

    @Test("a restart reads no changelog record its store holds, and still knows every request it answered")
    func restartReadsOnlyTheTail() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await produceRequests(bootstrap: bootstrap, count: 120, options: generated(120, seed: 1))
        let before = try await run(bootstrap: bootstrap, group: "stored", directory: directory, total: 120)
        #expect(before.calls.callsByRequest.count == 120)
        let changelog = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4)
        let keys = Set(changelog.map { "\($0.partition):\(String(decoding: $0.key ?? [], as: UTF8.self))" })

        // The same requests again (an upstream re-send) and 30 new ones.
        try await resend(first, bootstrap: bootstrap)
        _ = try await produceRequests(bootstrap: bootstrap, count: 30, options: generated(30, seed: 2))
        // Every user in memory (`--state-cache-users all`): the restore takes each key from the store.
        let after = try await run(
            bootstrap: bootstrap, group: "stored", directory: directory, total: 270, residentUsers: nil)
        // Every record the first run wrote was in the store when it stopped: none read again.
        #expect(after.changelog == 0, "changelog records read past the checkpoints")
        #expect(after.store == keys.count, "the store holds the changelog's latest record of each key")
        // What it restored from the store is the journal: the re-sent requests are duplicates.
        #expect(after.duplicates == 120)
        #expect(after.calls.callsByRequest.count == 30 && after.calls.repeated.isEmpty)
    }

    @Test("a store of another changelog (the cluster's topics created again) is rebuilt, not trusted")
    func foreignStoreRebuilt() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A first cluster, and a store that reflects its changelog.
        let old = try embeddedClusterWithTopics(partitions: 4)
        _ = try await produceRequests(bootstrap: old.bootstrapServers, count: 60, options: generated(60, seed: 3))
        _ = try await run(bootstrap: old.bootstrapServers, group: "moved", directory: directory, total: 60)
        // Another cluster, same topic names and group, with a longer changelog of other requests:
        // the store's checkpoints fall inside it, but the records there are not the ones it saw.
        let new = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = new.bootstrapServers
        let requests = try await produceRequests(bootstrap: bootstrap, count: 150, options: generated(150, seed: 4))
        let other = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: other) }
        _ = try await run(bootstrap: bootstrap, group: "moved", directory: other, total: 150)
        let changelog = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4)
        // The old store on the new cluster, with the new requests re-sent.
        try await resend(requests, bootstrap: bootstrap)
        let moved = try await run(bootstrap: bootstrap, group: "moved", directory: directory, total: 300)
        // Rebuilt: every changelog record read, the re-sent requests known from it.
        #expect(moved.changelog == changelog.count)
        #expect(moved.duplicates == 150 && moved.calls.callsByRequest.isEmpty)
    }

    @Test("a store whose checkpoints lie past a shorter changelog (the topics created again) is rebuilt, not trusted")
    func storePastTheEndRebuilt() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let old = try embeddedClusterWithTopics(partitions: 4)
        _ = try await produceRequests(bootstrap: old.bootstrapServers, count: 150, options: generated(150, seed: 5))
        _ = try await run(bootstrap: old.bootstrapServers, group: "shorter", directory: directory, total: 150)
        // Another cluster, the same topic names and group, and a shorter changelog.
        let new = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = new.bootstrapServers
        let requests = try await produceRequests(bootstrap: bootstrap, count: 40, options: generated(40, seed: 6))
        let other = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: other) }
        _ = try await run(bootstrap: bootstrap, group: "shorter", directory: other, total: 40)
        let changelog = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4)
        // What state-check says of the old store here: every partition rebuilt, some past the end.
        let check = try await StateStoreCheck.run(
            directory: directory, group: "shorter", stateTopic: Topics.state,
            kafka: KafkaConfiguration(["bootstrap.servers": bootstrap]), guarantee: .atLeastOnce,
            timeout: .seconds(60))
        #expect(check.partitions.count == 4 && check.partitions.allSatisfy { $0.verdict == .rebuilt }, "\(check)")
        #expect(check.partitions.contains { $0.checkpoint > $0.changelogEnd }, "no checkpoint past the end: \(check)")
        // Exactly-once, a restore rebuilds a checkpoint past the reported end without reading the
        // record before it (StoreRestorePlan): state-check must say so, not the at-least-once reason.
        let exactlyOnce = try await StateStoreCheck.run(
            directory: directory, group: "shorter", stateTopic: Topics.state,
            kafka: KafkaConfiguration(["bootstrap.servers": bootstrap]), guarantee: .exactlyOnce,
            timeout: .seconds(60))
        for (atLeastOnce, partition) in zip(check.partitions, exactlyOnce.partitions)
        where atLeastOnce.checkpoint > atLeastOnce.changelogEnd {
            #expect(
                atLeastOnce.rebuildReason?.hasPrefix("the changelog has no record at offset") == true,
                "\(atLeastOnce)")
            #expect(
                partition.verdict == .rebuilt && partition.rebuildReason?.contains("outside the changelog's") == true,
                "\(partition)")
        }
        try await resend(requests, bootstrap: bootstrap)
        let moved = try await run(bootstrap: bootstrap, group: "shorter", directory: directory, total: 80)
        // Rebuilt: every changelog record read, the re-sent requests known from it, none called.
        #expect(moved.changelog == changelog.count)
        #expect(moved.duplicates == 40 && moved.calls.callsByRequest.isEmpty)
    }

    @Test(
        "a store whose restore read only to a committed end is read again from there once the hold is over: what others committed in between is known, in offset order"
    )
    func storeReadAgainFromTheCommittedEnd() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        _ = try await produceRequests(bootstrap: bootstrap, count: 40, options: generated(40, seed: 12))
        _ = try await run(bootstrap: bootstrap, group: "gap", directory: directory, total: 40)

        // Two requests of users the first run never saw, sent again after another owner answered
        // them: what a restore held by an open transaction did not read (docs/STATE.md, Restore).
        var options = generated(2, seed: 13)
        options.appID = "app_gap"
        options.users = 1_000_000
        var generator = RequestGenerator(options: options)
        let answered = (0..<2).map { _ in generator.next(nowMs: currentTimeMs()) }
        let someoneElse = generator.next(nowMs: currentTimeMs())
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        var partitions: [Int32] = []
        for request in answered {
            let report = try await producer.send(
                KafkaProducerRecord(topic: Topics.requests, key: request.key, value: request.value))
            partitions.append(report.partition)
        }
        func journal(
            _ request: RequestGenerator.Record, result: OutcomeResult?, attempts: Int = 1
        ) throws -> (key: [UInt8], value: [UInt8]) {
            let event = try PurchaseRequestEvent(jsonBytes: request.value)
            let record = JournalRecord(
                appID: event.appID, appUserID: event.appUserID, seq: 0,
                entry: .init(
                    requestID: event.requestID, attempts: attempts, startedAtMs: currentTimeMs(), result: result,
                    completedAtMs: result == nil ? nil : currentTimeMs()))
            return (record.key(slotCount: 100), record.jsonBytes())
        }
        // A key the store holds from below where the restore reads again, written again between
        // there and the checkpoint (state-check must not compare it with the older record).
        let rewritten = generator.next(nowMs: currentTimeMs())
        let older = try journal(rewritten, result: .purchased)
        let olderReport = try await producer.send(
            KafkaProducerRecord(topic: Topics.state, partition: partitions[1], key: older.key, value: older.value))
        // Past the store's checkpoints: the first request's result (another owner's), the second's
        // intent; then what this instance wrote after them, the second's result last, just before
        // the checkpoint (an older record of its key lies in between).
        var firstUnread: [Int32: Int64] = [:]
        var written: [Int32: [(key: [UInt8], value: [UInt8], offset: Int64)]] = [:]
        for (index, result) in [(0, OutcomeResult.purchased), (1, nil)] {
            let record = try journal(answered[index], result: result)
            let report = try await producer.send(
                KafkaProducerRecord(
                    topic: Topics.state, partition: partitions[index], key: record.key, value: record.value))
            firstUnread[report.partition] = min(firstUnread[report.partition] ?? .max, report.offset)
        }
        // (On the first one's partition, a record of another user stands for any write of this instance.)
        let own = [
            (partitions[0], try journal(someoneElse, result: .purchased)),
            (partitions[1], try journal(rewritten, result: .purchased, attempts: 2)),
            (partitions[1], try journal(answered[1], result: .purchased)),
        ]
        for (partition, record) in own {
            let report = try await producer.send(
                KafkaProducerRecord(topic: Topics.state, partition: partition, key: record.key, value: record.value))
            written[report.partition, default: []].append((record.key, record.value, report.offset))
        }
        await producer.close()
        let store = try StateStore(
            directory: directory, group: "gap", stateTopic: Topics.state, cacheBytes: 1 << 20,
            writeBufferBytes: 4 << 20, logger: Logger(label: "test"))
        try store.apply(
            [(older.key, older.value)], partition: olderReport.partition,
            checkpoint: .init(
                offset: olderReport.offset + 1, lastDigest: StateStore.digest(key: older.key, value: older.value)))
        for (partition, records) in written {
            let last = records.last!
            try store.apply(
                records.map { (Optional($0.key), $0.value) }, partition: partition,
                checkpoint: .init(
                    offset: last.offset + 1, lastDigest: StateStore.digest(key: last.key, value: last.value)))
            try store.setRereadOffset(firstUnread[partition]!, of: partition)
        }
        store.close()
        // state-check compares below where the restore reads again: nothing a restore trusts is wrong.
        let check = try await StateStoreCheck.run(
            directory: directory, group: "gap", stateTopic: Topics.state,
            kafka: KafkaConfiguration(["bootstrap.servers": bootstrap]), guarantee: .atLeastOnce,
            timeout: .seconds(60))
        #expect(check.isSafe, "\(check)")
        #expect(Set(check.partitions.compactMap(\.rereadFrom)) == Set(firstUnread.values), "\(check)")

        let after = try await run(bootstrap: bootstrap, group: "gap", directory: directory, total: 42)
        // Both known as answered: the first from the record read again, the second from its own
        // result applied after its older intent.
        #expect(after.duplicates == 2, "called: \(after.calls.callsByRequest.keys.sorted())")
        #expect(after.calls.callsByRequest.isEmpty)
        let reopened = try StateStore(
            directory: directory, group: "gap", stateTopic: Topics.state, cacheBytes: 1 << 20,
            writeBufferBytes: 4 << 20, logger: Logger(label: "test"))
        defer { reopened.close() }
        // Read to the end this time: nothing to read again.
        for partition in firstUnread.keys { #expect(try reopened.rereadOffset(of: partition) == nil) }
    }

    @Test("state-check finds a store the changelog vouches for consistent, and a changed or added key wrong")
    func stateCheckComparesKeyForKey() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let directory = RunCommand.stateDirectory(root, group: "checked")!
        _ = try await produceRequests(bootstrap: bootstrap, count: 80, options: generated(80, seed: 7))
        _ = try await run(bootstrap: bootstrap, group: "checked", directory: directory, total: 80)
        let changelog = try await readTopic(bootstrap: bootstrap, topic: Topics.state, partitions: 4)
        let keys = Set(changelog.map { "\($0.partition):\(String(decoding: $0.key ?? [], as: UTF8.self))" })
        func check() async throws -> StateStoreCheck {
            try await StateStoreCheck.run(
                directory: directory, group: "checked", stateTopic: Topics.state,
                kafka: KafkaConfiguration(["bootstrap.servers": bootstrap]), guarantee: .atLeastOnce,
                timeout: .seconds(60))
        }
        let clean = try await check()
        #expect(clean.isSafe && clean.partitions.allSatisfy { $0.verdict == .consistent }, "\(clean)")
        #expect(clean.partitions.reduce(0) { $0 + $1.matching } == keys.count)

        // One value changed and one key added, the checkpoint kept: what a restore would trust.
        let victim = changelog.first { $0.partition == clean.partitions[0].partition }!
        let store = try StateStore(
            directory: directory, group: "checked", stateTopic: Topics.state, cacheBytes: 1 << 20,
            writeBufferBytes: 4 << 20, logger: Logger(label: "test"))
        let checkpoint = try store.checkpoint(of: victim.partition)!
        try store.apply(
            [(victim.key, Array("{}".utf8)), (Array("app:added".utf8), Array("{}".utf8))], partition: victim.partition,
            checkpoint: checkpoint)
        store.close()
        let tampered = try await check()
        let partition = tampered.partitions.first { $0.partition == victim.partition }!
        #expect(!tampered.isSafe && partition.verdict == .trustedAndWrong)
        #expect(partition.different == 1 && partition.extra == 1 && partition.missing == 0, "\(partition)")
        let rendered = StateCheckCommand.table(tampered)
        #expect(rendered.contains("trusted-and-wrong") && rendered.contains("extra: app:added"), "\(rendered)")
    }

    @Test(
        "with ten users in memory, the others are read from the store when their records arrive: re-sent requests are duplicates, no user's changes start over, and a restart reads no user"
    )
    func usersReadFromTheStore() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: 4)
        let bootstrap = cluster.bootstrapServers
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-state-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var options = generated(300, seed: 11)
        options.users = 150
        let requests = try await produceRequests(bootstrap: bootstrap, count: 300, options: options)
        let users = Set(requests.map { String(decoding: $0.key, as: UTF8.self) }).count
        func run(
            total: Int64, resending: Bool
        ) async throws -> (RecordingController.State, ProcessorStatistics, Int, readAgain: Int?) {
            let controller = RecordingController()
            let processor = try processor(
                bootstrap: bootstrap, group: "resident", maxInFlight: 16, controller: controller
            ) {
                $0.stateDirectory = directory
                $0.residentUsers = 10
            }
            async let running: Void = processor.run()
            func committed(_ total: Int64) async throws -> Bool {
                try await eventually(timeout: .seconds(180)) {
                    try await committedOffsets(
                        bootstrap: bootstrap, group: "resident", topic: Topics.requests, partitions: 4
                    )
                    .values.reduce(0, +) == total
                }
            }
            var finished = try await committed(resending ? total - 300 : total)
            var readAgain: Int? = nil
            if resending {
                // Re-sent once the users were let go: each is read back from the store to answer it.
                let letGo = await eventually(timeout: .seconds(60)) { processor.statistics.residentUsers <= 10 }
                #expect(letGo, "users were not let go: \(processor.statistics.residentUsers) in memory")
                let before = processor.statistics
                try await resend(requests, bootstrap: bootstrap)
                finished = try await committed(total)
                readAgain = processor.statistics.userLoads - before.userLoads - (users - before.residentUsers)
                // (Users read back stay while their records are unwritten or used since the last
                // pass; once all is written they are let go again, down to the limit.)
                let letGoAgain = await eventually(timeout: .seconds(60)) { processor.statistics.residentUsers <= 10 }
                #expect(letGoAgain, "users read back were not let go: \(processor.statistics.residentUsers) in memory")
            }
            let statistics = processor.statistics
            let metrics = processor.metrics()
            processor.shutdown()
            try await running
            #expect(finished, "the group did not commit \(total) requests")
            let stored =
                metrics.split(separator: "\n").first {
                    $0.hasPrefix("encore_state_restore_store_records_total ")
                }.flatMap { Int($0.split(separator: " ")[1]) } ?? -1
            return (controller.snapshot, statistics, stored, readAgain)
        }
        let (calls, statistics, _, readAgain) = try await run(total: 600, resending: true)
        #expect(calls.callsByRequest.count == 300 && calls.repeated.isEmpty, "each request called once")
        #expect(statistics.duplicates == 300, "every re-sent request known from its user's journal read back")
        #expect(statistics.userLoads >= users, "each user read once at least")
        #expect((readAgain ?? -1) >= 0, "a user let go was answered without being read back (\(readAgain ?? 0))")
        // A user's changes are numbered on from its state read back: no number twice.
        let changes = try await readTopic(bootstrap: bootstrap, topic: Topics.entitlements, partitions: 4).map {
            try EntitlementChangeEvent(jsonBytes: $0.value)
        }
        var numbers: [String: [Int64]] = [:]
        for change in changes { numbers[change.appUserID, default: []].append(change.sequence) }
        #expect(!changes.isEmpty)
        for (user, sequence) in numbers {
            #expect(sequence == Array(1...Int64(sequence.count)), "user \(user)'s changes: \(sequence)")
        }

        // A restart reads no user from the store (none has an open request), and still knows them.
        try await resend(requests, bootstrap: bootstrap)
        let (again, restarted, stored, _) = try await run(total: 900, resending: false)
        #expect(stored == 0, "the restart read \(stored) records from the store")
        #expect(again.callsByRequest.isEmpty && restarted.duplicates == 300)
    }

    @Test("each group id gets a directory of its own under --state-dir, and 'none' turns the store off")
    func directoryPerGroup() {
        let groups = ["a/b", "a_b", "a%2Fb", "..", ".hidden", "encore-processor", "é"]
        let directories = groups.map { RunCommand.stateDirectory("/state", group: $0) }
        #expect(Set(directories).count == groups.count, "\(directories)")
        #expect(
            directories.allSatisfy {
                $0.map { URL(fileURLWithPath: $0).deletingLastPathComponent().path == "/state" } ?? false
            })
        #expect(RunCommand.stateDirectory("/state", group: "encore-processor") == "/state/encore-processor")
        #expect(RunCommand.stateDirectory("none", group: "g") == nil)
    }
}
