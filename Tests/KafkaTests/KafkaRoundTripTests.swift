import Foundation
@testable import Kafka
import Synchronization
import TestSupport
import Testing

@Suite("Kafka layer on the embedded broker")
struct KafkaRoundTripTests {
    @Test("records round-trip with keys, headers and coordinates")
    func roundTrip() async throws {
        let broker = try TestCluster(topics: ["t": 3])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        var reports: [KafkaDeliveryReport] = []
        for index in 0..<30 {
            let record = KafkaProducerRecord(
                topic: "t", key: Array("user-\(index % 5)".utf8), value: Array("value-\(index)".utf8),
                headers: [KafkaHeader(key: "ce_id", string: "id-\(index)"), KafkaHeader(key: "empty", value: nil)])
            reports.append(try await producer.send(record))
        }
        #expect(Set(reports.map(\.topic)) == ["t"])
        let probe = ConsumerProbe(consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "g")))
        try probe.consumer.subscribe(topics: ["t"])
        let messages = await probe.waitForMessages(30)
        #expect(messages.count == 30)
        for message in messages {
            let index = Int(String(decoding: message.value, as: UTF8.self).dropFirst("value-".count))!
            #expect(message.key == Array("user-\(index % 5)".utf8))
            #expect(message.header("ce_id") == "id-\(index)")
            #expect(message.headers.contains(KafkaHeader(key: "empty", value: nil)))
            #expect(message.timestampMs != nil)
            let report = reports[index]
            #expect(report.partition == message.partition && report.offset == message.offset)
        }
        // One key always lands on one partition.
        let partitionsByKey = Dictionary(grouping: messages, by: { $0.key! }).mapValues { Set($0.map(\.partition)) }
        #expect(partitionsByKey.values.allSatisfy { $0.count == 1 })
        await probe.close()
        await producer.close()
    }

    @Test("a partition reader folds exactly the offset ranges asked for, in order; a whole read reaches the end")
    func partitionReaderRanges() async throws {
        let broker = try TestCluster(topics: ["ranges": 2])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        for partition in Int32(0)..<2 {
            for index in 0..<20 {
                try await producer.send(
                    KafkaProducerRecord(
                        topic: "ranges", partition: partition, key: nil, value: Array("\(partition)-\(index)".utf8)))
            }
        }
        await producer.close()
        let read = try await KafkaPartitionReader.fold(
            configuration: broker.producerConfiguration, topic: "ranges", ranges: [0: 5..<12, 1: 19..<20],
            into: [String]()
        ) { values, message in values.append(String(decoding: message.value, as: UTF8.self)) }
        #expect(read.records == 8)
        #expect(read.state.filter { $0.hasPrefix("0-") } == (5..<12).map { "0-\($0)" })
        #expect(read.state.filter { $0.hasPrefix("1-") } == ["1-19"])
        let whole = try await KafkaPartitionReader.fold(
            configuration: broker.producerConfiguration, topic: "ranges", partitions: [0, 1], into: 0
        ) { count, _ in count += 1 }
        #expect(whole.state == 40 && whole.records == 40)
    }

    @Test("a partition reader cancelled before its end says so: no timeout reported (a stopping processor logged one)")
    func partitionReaderCancelled() async throws {
        let broker = try TestCluster(topics: ["short": 1])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        for index in 0..<5 {
            try await producer.send(
                KafkaProducerRecord(topic: "short", partition: 0, key: nil, value: Array("\(index)".utf8)))
        }
        await producer.close()
        let folded = Atomic<Int>(0)
        // A range past the records: the read waits for the rest until cancelled.
        let read = Task {
            try await KafkaPartitionReader.fold(
                configuration: broker.producerConfiguration, topic: "short", ranges: [0: 0..<100],
                timeout: .seconds(600), into: 0
            ) { count, _ in
                count += 1
                folded.add(1, ordering: .relaxed)
            }
        }
        #expect(await eventually { folded.load(ordering: .relaxed) == 5 })
        read.cancel()
        do {
            let result = try await read.value
            Issue.record("the cancelled read returned \(result.records) records")
        } catch let error as KafkaError {
            #expect(error.code == .cancelled, "\(error)")
        }
    }

    @Test("a new member of the group resumes after the committed offset")
    func commitAndResume() async throws {
        let broker = try TestCluster(topics: ["orders": 1])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        for index in 0..<10 {
            try await producer.send(KafkaProducerRecord(topic: "orders", key: nil, value: Array("\(index)".utf8)))
        }
        let first = ConsumerProbe(consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "g")))
        try first.consumer.subscribe(topics: ["orders"])
        let firstBatch = await first.waitForMessages(10)
        #expect(firstBatch.count == 10)
        // Processed only the first six: store and commit offset 6 (the next to read).
        try first.consumer.storeOffsets([KafkaTopicPartitionOffset(topic: "orders", partition: 0, offset: 6)])
        try await first.consumer.commit()
        let committed = try await first.consumer.committed([KafkaTopicPartition(topic: "orders", partition: 0)])
        #expect(committed.map(\.offset) == [6])
        await first.close()

        let second = ConsumerProbe(consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "g")))
        try second.consumer.subscribe(topics: ["orders"])
        let resumed = await second.waitForMessages(4)
        #expect(resumed.map(\.offset) == [6, 7, 8, 9])
        await second.close()
        await producer.close()
    }

    @Test("commit metadata is kept with the offset and read back")
    func commitMetadata() async throws {
        let broker = try TestCluster(topics: ["meta": 2])
        let consumer = try KafkaConsumer(configuration: broker.consumerConfiguration(group: "meta-group"))
        try await consumer.commit([
            KafkaTopicPartitionOffset(topic: "meta", partition: 0, offset: 5, metadata: "encore1:AQ=="),
            KafkaTopicPartitionOffset(topic: "meta", partition: 1, offset: 9),
        ])
        let committed = try await consumer.committed([
            KafkaTopicPartition(topic: "meta", partition: 0), KafkaTopicPartition(topic: "meta", partition: 1),
        ])
        #expect(committed.map(\.offset) == [5, 9])
        #expect(committed[0].metadata == "encore1:AQ==")
        await consumer.close()
    }

    @Test("two members of one group split the partitions")
    func groupSplitsPartitions() async throws {
        let broker = try TestCluster(topics: ["split": 4])
        let configuration = broker.consumerConfiguration(group: "split-group")
        let one = ConsumerProbe(consumer: try KafkaConsumer(configuration: configuration))
        let two = ConsumerProbe(consumer: try KafkaConsumer(configuration: configuration))
        try one.consumer.subscribe(topics: ["split"])
        try two.consumer.subscribe(topics: ["split"])
        // (The default deadline: beside stress-ng the suite's tasks queue for tens of seconds, and a
        // member joins only once its probe polls; 45 s ran out with the second one not yet in.)
        let split = await eventually {
            one.assigned.count == 2 && two.assigned.count == 2
        }
        #expect(split, "assignments: \(one.assigned) / \(two.assigned)")
        #expect(one.assigned.isDisjoint(with: two.assigned))
        #expect(one.assigned.union(two.assigned).count == 4)
        await one.close()
        await two.close()
    }

    @Test("prepare reads a topic's metadata before the first record (its partition count)")
    func prepareTopic() async throws {
        let broker = try TestCluster(topics: ["prep": 5])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        #expect(try await producer.prepare(topic: "prep") == 5)
        try await producer.send(KafkaProducerRecord(topic: "prep", key: nil, value: [1]))
        await producer.close()
    }

    @Test("prepare leaves an idempotent producer asking for its producer id, not waiting 500 ms to ask")
    func prepareAsksForTheProducerID() async throws {
        // (Three brokers: the bootstrap connections are replaced by the brokers the metadata names.)
        let broker = try TestCluster(brokers: 3, topics: ["pid": 4])
        var configuration = broker.producerConfiguration
        configuration["statistics.interval.ms"] = "10"
        let producer = try KafkaProducer(configuration: configuration)
        try await producer.prepare(topic: "pid")
        let prepared = monotonicMicroseconds()
        // The state in the first statistics librdkafka wrote after prepare returned. Without a
        // broker up to ask when it first tried, it stays WaitTransport until its next try, 500 ms
        // later: the generator's first records waited that long in its queue, counted as latency.
        // (A test task held longer than that between these lines would see Assigned either way:
        // it cannot fail, only miss.)
        var state: String?
        #expect(
            await eventually {
                let statistics = producer.client.callbacks.statistics.withLock { $0 }
                guard let written = statistics.writtenAtMicroseconds, written > prepared else { return false }
                state = statistics.producerIDState
                return true
            })
        #expect(state == "WaitPID" || state == "Assigned", "the producer id's state after prepare: \(state ?? "none")")
        await producer.close()
    }

    @Test("an admission stops delivery at its capacity until records are released; nothing is fetched twice")
    func admission() async throws {
        let broker = try TestCluster(topics: ["adm": 2])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        for index in 0..<300 {
            try producer.produce(
                KafkaProducerRecord(topic: "adm", partition: Int32(index % 2), key: nil, value: Array("\(index)".utf8))
            ) { _ in }
        }
        try await producer.flush()
        // A stall limit longer than the test: the consumer must stop polling, not pause.
        let admission = KafkaAdmission(capacity: 20, stallLimit: .seconds(600))
        let probe = ConsumerProbe(
            consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "ag"), admission: admission))
        try probe.consumer.subscribe(topics: ["adm"])
        #expect(await probe.waitForMessages(20).count >= 20)
        // Several poll cycles with a full buffer: no more than the capacity is handed out.
        let overflowed = await eventually(timeout: .seconds(1)) { probe.messages.count > 20 }
        #expect(!overflowed, "\(probe.messages.count) records handed out with capacity 20")
        #expect(admission.held == 20)
        var released = 0
        while released < 300 {
            // The buffer refills to its capacity, never beyond it.
            let expected = min(released + 20, 300)
            #expect(await eventually { probe.messages.count >= expected })
            #expect(probe.messages.count == expected)
            admission.release(expected - released)
            released = expected
        }
        let all = probe.messages
        #expect(all.count == 300)
        // Each record exactly once: waiting for room never discards and refetches what was prefetched.
        for partition in Int32(0)..<2 {
            #expect(all.filter { $0.partition == partition }.map(\.offset) == Array(0..<150))
        }
        #expect(admission.held == 0)
        await probe.close()
        await producer.close()
    }

    @Test("an admission that stays full pauses the partitions after its stall limit and resumes them when released")
    func admissionStall() async throws {
        let broker = try TestCluster(topics: ["stall": 1])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        for index in 0..<50 {
            try await producer.send(KafkaProducerRecord(topic: "stall", key: nil, value: Array("\(index)".utf8)))
        }
        let admission = KafkaAdmission(capacity: 10, stallLimit: .milliseconds(300))
        let probe = ConsumerProbe(
            consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "sg"), admission: admission))
        try probe.consumer.subscribe(topics: ["stall"])
        #expect(await probe.waitForMessages(10).count >= 10)
        // Past the stall limit the partitions are paused (and polled on, serving rebalances)...
        #expect(await eventually { admission.isPausedForRoom })
        let overflowed = await eventually(timeout: .seconds(1)) { probe.messages.count > 10 }
        #expect(!overflowed, "\(probe.messages.count) records handed out with capacity 10")
        // ...and resumed once records are released.
        // (Not "unpaused" as such: once ten more are out the buffer is full again and, past the stall
        // limit, paused again, so that state may last only a moment.)
        admission.release(10)
        #expect(await eventually { probe.messages.count > 10 })
        #expect(probe.messages.count <= 20, "more handed out than released room for")
        var released = 10
        while released < 50 {
            let received = probe.messages.count
            admission.release(received - released)
            released = received
            if released < 50 { #expect(await eventually { probe.messages.count > received }) }
        }
        let all = probe.messages
        #expect(all.count == 50)
        #expect(all.map(\.offset) == Array(0..<50))
        await probe.close()
        await producer.close()
    }

    @Test("pause stops delivery and resume restarts it")
    func pauseAndResume() async throws {
        let broker = try TestCluster(topics: ["p": 1])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration)
        let probe = ConsumerProbe(consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "pg")))
        try probe.consumer.subscribe(topics: ["p"])
        try await producer.send(KafkaProducerRecord(topic: "p", key: nil, value: Array("before".utf8)))
        #expect(await probe.waitForMessages(1).count == 1)

        let partition = KafkaTopicPartition(topic: "p", partition: 0)
        try probe.consumer.pause([partition])
        for index in 0..<5 {
            try await producer.send(KafkaProducerRecord(topic: "p", key: nil, value: Array("paused-\(index)".utf8)))
        }
        // The records are on the broker (acknowledged above); a paused partition must not deliver them.
        // Give the fetcher several fetch cycles to prove it stays quiet.
        let leaked = await eventually(timeout: .seconds(2)) { probe.messages.count > 1 }
        #expect(!leaked, "a paused partition delivered \(probe.messages.count - 1) records")

        try probe.consumer.resume([partition])
        let all = await probe.waitForMessages(6)
        #expect(all.count == 6)
        #expect(all.map(\.offset) == Array(0..<6))
        await probe.close()
        await producer.close()
    }

    @Test(
        "records produced from one reused buffer arrive as the same records produced as values do: key, none or empty, value, headers, partition or none"
    )
    func bufferRoundTrip() async throws {
        let broker = try TestCluster(topics: ["buf": 3, "val": 3])
        let delivered = Mutex<[KafkaDelivery]>([])
        let producer = try KafkaProducer(configuration: broker.producerConfiguration) { batch in
            delivered.withLock { $0 += batch }
        }
        // Long, keyed, many headers first; then shorter, without a key or with an empty one, with a
        // null and an empty header value: what the buffer held before must not leak into the next.
        var records: [KafkaProducerRecord] = []
        for index in 0..<40 {
            var headers = (0..<(index % 5)).map { KafkaHeader(key: "h\($0)", string: "value-\(index)-\($0)") }
            headers += [KafkaHeader(key: "null", value: nil), KafkaHeader(key: "empty", value: [])]
            let key: [UInt8]? = [nil, [], Array("key-\(index)".utf8)][index % 3]
            let value = Array(("\(index)|" + String(repeating: "x", count: 400 - index * 10)).utf8)
            let partition: Int32? = index % 4 == 0 ? nil : Int32(index % 3)
            records.append(
                KafkaProducerRecord(topic: "buf", partition: partition, key: key, value: value, headers: headers))
        }
        var buffer = KafkaRecordBuffer()
        for (index, record) in records.enumerated() {
            buffer.begin(with: record)
            try producer.produce(buffer, token: UInt(index))
            // The same record as a value, to a topic of its own: what the buffer's must equal.
            var asValue = record
            asValue.topic = "val"
            try producer.produce(asValue, token: UInt(records.count + index))
        }
        #expect(await eventually { delivered.withLock { $0.count } == 2 * records.count })
        #expect(delivered.withLock { $0.allSatisfy { $0.error == nil } })
        let probe = ConsumerProbe(consumer: try KafkaConsumer(configuration: broker.consumerConfiguration(group: "gb")))
        try probe.consumer.subscribe(topics: ["buf", "val"])
        let messages = await probe.waitForMessages(2 * records.count)
        #expect(messages.count == 2 * records.count)
        func index(_ message: KafkaMessage) -> Int? {
            Int(String(decoding: message.value.prefix { $0 != UInt8(ascii: "|") }, as: UTF8.self))
        }
        let asValues = Dictionary(
            messages.filter { $0.topic == "val" }.map { (index($0)!, $0) }, uniquingKeysWith: { first, _ in first })
        for message in messages where message.topic == "buf" {
            let index = try #require(index(message))
            let record = records[index]
            let expected = try #require(asValues[index])
            if let partition = record.partition {
                #expect(message.partition == partition, "record \(index): partition")
            } else if record.key?.isEmpty == false {
                // (By key's hash; without a key the partitioner picks at random.)
                #expect(message.partition == expected.partition, "record \(index): partition")
            }
            if let key = record.key, !key.isEmpty { #expect(message.key == key, "record \(index): key") }
            #expect(message.key == expected.key, "record \(index): key")
            #expect(message.value == record.value && message.value == expected.value, "record \(index): value")
            #expect(
                message.headers == record.headers && message.headers == expected.headers, "record \(index): headers")
        }
        await probe.close()
        await producer.close()
    }
}

@Suite("Kafka layer errors")
struct KafkaErrorTests {
    @Test("an unknown property or invalid value is an error that names it")
    func invalidConfiguration() throws {
        let unknown = #expect(throws: KafkaError.self) {
            try KafkaConfiguration(["no.such.property": "1"]).validate()
        }
        #expect(unknown?.code == .invalidConfiguration)
        #expect(unknown?.message.contains("no.such.property") == true)

        let invalid = #expect(throws: KafkaError.self) {
            try KafkaProducer(configuration: KafkaConfiguration(["acks": "sometimes"]))
        }
        #expect(invalid?.message.contains("acks") == true)
        #expect(throws: KafkaError.self) { try KafkaConfiguration.parseAssignment("novalue") }
        #expect(try KafkaConfiguration.parseAssignment("a.b=c=d") == ("a.b", "c=d"))
    }

    @Test("delivery to a missing topic throws instead of hanging")
    func missingTopic() async throws {
        let broker = try TestCluster(topics: [:])
        var configuration = broker.producerConfiguration
        configuration["message.timeout.ms"] = "2000"
        // The mock cluster creates topics on first use; make it answer as a cluster without the topic.
        broker.cluster.setTopicError("missing", .unknownTopicOrPartition)
        let producer = try KafkaProducer(configuration: configuration)
        let error = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaProducerRecord(topic: "missing", key: nil, value: [1]))
        }
        #expect(error?.message.contains("missing") == true)
        await producer.close(timeout: .seconds(1))
    }

    @Test("delivery while the only broker is down throws instead of hanging")
    func brokerDown() async throws {
        let broker = try TestCluster(topics: ["down": 1])
        var configuration = broker.producerConfiguration
        configuration["message.timeout.ms"] = "2000"
        let producer = try KafkaProducer(configuration: configuration)
        try await producer.send(KafkaProducerRecord(topic: "down", key: nil, value: [1]))
        // The outage: no answer within message.timeout.ms. (Taking the mock broker down rebinds
        // its port at once, and librdkafka aborts the test process when another socket took it.)
        try broker.cluster.setRoundTripTime(broker: 1, .seconds(30))
        let error = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaProducerRecord(topic: "down", key: nil, value: [2]))
        }
        #expect(error?.isRetriable == true)
        await producer.close(timeout: .seconds(1))
    }

    @Test("records produced with a token are answered in batches, every token once; a failure hands the record back")
    func tokenDeliveries() async throws {
        let broker = try TestCluster(topics: ["tok": 2])
        var configuration = broker.producerConfiguration
        configuration["message.timeout.ms"] = "2000"
        let answers = Mutex<(batches: Int, deliveries: [KafkaDelivery])>((0, []))
        let producer = try KafkaProducer(configuration: configuration) { batch in
            answers.withLock {
                $0.batches += 1
                $0.deliveries += batch
            }
        }
        let count = 2000
        for token in 0..<UInt(count) {
            try producer.produce(
                KafkaProducerRecord(topic: "tok", key: Array("k\(token % 7)".utf8), value: Array("\(token)".utf8)),
                token: token)
        }
        #expect(await eventually { answers.withLock { $0.deliveries.count } == count })
        let (batches, deliveries) = answers.withLock { ($0.batches, $0.deliveries) }
        #expect(Set(deliveries.map(\.token)) == Set(0..<UInt(count)))
        #expect(deliveries.allSatisfy { $0.error == nil && $0.record == nil })
        #expect(batches < count / 10, "deliveries are handed over in batches (\(batches) batches)")

        broker.cluster.setTopicError("gone", .unknownTopicOrPartition)
        let headers = [KafkaHeader(key: "h", string: "v")]
        try producer.produce(
            KafkaProducerRecord(topic: "gone", partition: 0, key: [1], value: [2, 3], headers: headers), token: 99_999)
        #expect(await eventually { answers.withLock { $0.deliveries.count } == count + 1 })
        let failed = try #require(answers.withLock { $0.deliveries.last })
        #expect(failed.token == 99_999)
        #expect(failed.error?.message.contains("gone") == true)
        #expect(failed.record?.topic == "gone")
        #expect(failed.record?.partition == 0)
        #expect(failed.record?.key == [1])
        #expect(failed.record?.value == [2, 3])
        #expect(failed.record?.headers == headers)
        await producer.close(timeout: .seconds(1))
    }

    @Test("an injected produce error surfaces with librdkafka's code and name")
    func injectedError() async throws {
        let broker = try TestCluster(topics: ["inj": 1])
        var configuration = broker.producerConfiguration
        configuration["enable.idempotence"] = "false"
        configuration["retries"] = "0"
        let producer = try KafkaProducer(configuration: configuration)
        try await producer.send(KafkaProducerRecord(topic: "inj", key: nil, value: [1]))
        broker.cluster.pushRequestErrors(apiKey: 0, [KafkaError.Code(rawValue: 87)])  // INVALID_RECORD
        let error = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaProducerRecord(topic: "inj", key: nil, value: [2]))
        }
        #expect(error?.name == "INVALID_RECORD")
        await producer.close(timeout: .seconds(1))
    }
}

@Suite("Rebalance protocol")
struct RebalanceProtocolTests {
    /// librdkafka names no protocol on an error (its group handler cannot answer, as while the
    /// consumer closes): read as an implicitly unwrapped pointer, that crashed the process.
    @Test("no protocol name (an error, as while the consumer closes) is an eager rebalance, not a crash")
    func unnamedProtocol() {
        #expect(KafkaConsumer.isCooperative(rebalanceProtocol: nil) == false)
        #expect("COOPERATIVE".withCString { KafkaConsumer.isCooperative(rebalanceProtocol: $0) })
        #expect("EAGER".withCString { KafkaConsumer.isCooperative(rebalanceProtocol: $0) } == false)
    }
}

@Suite("Partitioner")
struct PartitionerTests {
    @Test("murmur2 places keys where librdkafka's murmur2 partitioner does")
    func agreesWithLibrdkafka() async throws {
        let broker = try TestCluster(topics: ["p": 7])
        var configuration = broker.producerConfiguration
        configuration["partitioner"] = "murmur2"
        let producer = try KafkaProducer(configuration: configuration)
        // Keys of every length modulo 4, and non-ASCII bytes.
        let keys = (0..<60).map { Array("app_\($0 % 3):user-\(String(repeating: "x", count: $0 % 9))ü\($0)".utf8) }
        for key in keys {
            let report = try await producer.send(KafkaProducerRecord(topic: "p", key: key, value: [1]))
            #expect(report.partition == KafkaPartitioner.murmur2Partition(key: key, partitions: 7), "\(key)")
        }
        await producer.close()
    }
}

/// librdkafka's clock for its statistics' `ts`: `CLOCK_MONOTONIC`, in µs.
private func monotonicMicroseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1_000_000 + Int64(now.tv_nsec) / 1000
}
