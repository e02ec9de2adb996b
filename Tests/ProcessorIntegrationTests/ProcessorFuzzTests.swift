import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka
import Synchronization
import TestSupport
import Testing

/// Mutated records through a running processor on the embedded broker. `ENCORE_FUZZ_PROCESSOR_RECORDS`
/// sets how many (`scripts/fuzz.sh` runs 100,000), `ENCORE_FUZZ_SEED` which ones.
@Suite("Processor fuzzing")
struct ProcessorFuzzTests {
    static let environment = ProcessInfo.processInfo.environment
    static let count = environment["ENCORE_FUZZ_PROCESSOR_RECORDS"].flatMap(Int.init) ?? 2_000
    static let seed = environment["ENCORE_FUZZ_SEED"].flatMap(UInt64.init) ?? 7
    /// The mock keeps ~5 MiB per partition: long runs spread over more partitions.
    static let partitions = environment["ENCORE_FUZZ_PARTITIONS"].flatMap(Int32.init) ?? 8

    @Test("no crash or hang: every invalid record is a dead letter with its reason, every valid one an outcome")
    func fuzzedRecords() async throws {
        let cluster = try embeddedClusterWithTopics(partitions: Int(Self.partitions))
        let bootstrap = cluster.bootstrapServers
        // Small values: the mock cluster keeps only ~5 MiB per partition.
        var fuzzer = RecordFuzzer(seed: Self.seed, largestValue: 8_000)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
        let reports = Mutex<[Int: KafkaDeliveryReport]>([:])
        var records: [RecordFuzzer.Record] = []
        for index in 0..<Self.count {
            let record = fuzzer.next()
            records.append(record)
            try producer.produce(
                KafkaProducerRecord(
                    topic: Topics.requests, key: record.key, value: record.value, headers: record.headers)
            ) { result in
                if case .success(let report) = result { reports.withLock { $0[index] = report } }
            }
        }
        try await producer.flush(timeout: .seconds(120))
        await producer.close()
        let delivered = reports.withLock { $0 }
        #expect(delivered.count == Self.count)
        // The mock keeps little per partition and drops the oldest records of a full one: what it
        // dropped before the processor could read it is left out of the expectations, by offset.
        let requestsStart = try await lowWatermarks(bootstrap: bootstrap, topic: Topics.requests)
        let mutations = records.indices.compactMap { index -> (partition: Int32, offset: Int64, valid: String?)? in
            guard let report = delivered[index], report.offset >= requestsStart[report.partition] ?? 0 else {
                return nil
            }
            return (
                report.partition, report.offset, try? PurchaseRequestEvent(jsonBytes: records[index].value).requestID
            )
        }
        let validIDs = Set(mutations.compactMap(\.valid))
        let invalid = Set(mutations.filter { $0.valid == nil }.map { "\($0.partition)@\($0.offset)" })
        let shared = Dictionary(grouping: mutations.compactMap(\.valid), by: { $0 }).filter { $0.value.count > 1 }.keys
        #expect(shared.isEmpty, "the fuzzer made two records with one id: \(shared.sorted().prefix(5))")

        let controller = RecordingController()
        let processor = try ProcessorIntegrationTests.processor(
            bootstrap: bootstrap, group: "fuzz", maxInFlight: 64, controller: controller)
        async let running: Void = processor.run()
        let done = await eventually(timeout: .seconds(max(180, Self.count / 200))) {
            processor.statistics.finished >= mutations.count
        }
        #expect(done, "finished \(processor.statistics.finished) of \(mutations.count)")
        processor.shutdown()
        try await running
        #expect(processor.statistics.finished == mutations.count)

        let outcomes = try await readTopic(bootstrap: bootstrap, topic: Topics.outcomes, partitions: Self.partitions)
            .map { try PurchaseOutcomeEvent(jsonBytes: $0.value) }
        let lostOutcomes = try await lowWatermarks(bootstrap: bootstrap, topic: Topics.outcomes).values.reduce(0, +)
        #expect(Set(outcomes.map(\.requestID)).isSubset(of: validIDs))
        #expect(Int64(outcomes.count) + lostOutcomes == Int64(validIDs.count), "\(lostOutcomes) dropped by the mock")
        // Each valid request called once at most: a mutated deadline_at_ms in the past is answered
        // not_attempted without a call.
        let calls = controller.snapshot
        #expect(calls.repeated.isEmpty && Set(calls.callsByRequest.keys).isSubset(of: validIDs))
        if lostOutcomes == 0 { #expect(calls.calls == outcomes.count { $0.attempts > 0 }) }
        let letters = try await readTopic(bootstrap: bootstrap, topic: Topics.deadLetters, partitions: Self.partitions)
            .map { try DeadLetterEvent(jsonBytes: $0.value) }
        let lostLetters = try await lowWatermarks(bootstrap: bootstrap, topic: Topics.deadLetters).values.reduce(0, +)
        #expect(Set(letters.map { "\($0.originalPartition)@\($0.originalOffset)" }).isSubset(of: invalid))
        #expect(Int64(letters.count) + lostLetters == Int64(invalid.count), "\(lostLetters) dropped by the mock")
        let unexplained = letters.filter { $0.error.message.isEmpty || $0.error.errorClass.isEmpty }
        #expect(unexplained.isEmpty, "dead letters without a reason: \(unexplained.count)")
        withExtendedLifetime(cluster) {}
    }
}

/// The first offset still held of each partition of `topic`.
func lowWatermarks(bootstrap: String, topic: String) async throws -> [Int32: Int64] {
    let admin = try KafkaAdmin(configuration: KafkaConfiguration(["bootstrap.servers": bootstrap]))
    var low: [Int32: Int64] = [:]
    for partition in 0..<ProcessorFuzzTests.partitions {
        low[partition] = try await admin.watermarks(of: KafkaTopicPartition(topic: topic, partition: partition)).low
    }
    return low
}
