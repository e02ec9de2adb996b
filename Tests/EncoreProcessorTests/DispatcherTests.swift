import EncoreEvents
import Kafka
import TestSupport
import Testing

@testable import EncoreProcessor

@Suite("Dispatcher: lanes, bounds, backpressure and offsets (no Kafka)")
struct DispatcherTests {
    @Test("requests of one user run one at a time, in offset order, under heavy concurrency")
    func perUserOrder() async throws {
        let controller = RecordingController(latency: { request in
            .microseconds(Int(fnv1a(request.requestId) % 2000))
        })
        let harness = LoopHarness(configure: { $0.maxInFlight = 32 }, router: router(controller))
        harness.assign(partitions: 4)
        var expected: [String: [String]] = [:]
        for index in 0..<2000 {
            let user = "user-\(index % 50)"
            let event = request(index, user: user)
            expected[user, default: []].append(event.requestID)
            // One user's records share a partition, as their key does in Kafka.
            harness.feed(event, partition: Int32(index % 50 % 4))
        }
        #expect(await harness.waitForFinished(2000))
        let state = controller.snapshot
        #expect(state.overlaps.isEmpty, "users with overlapping calls: \(Set(state.overlaps))")
        #expect(state.callsByUser == expected)
        #expect(state.maxRunning <= 32)
        // The outcomes topic sees each user's outcomes in request order too.
        var outcomesByUser: [String: [String]] = [:]
        for outcome in harness.producer.outcomes() {
            outcomesByUser[outcome.appUserID, default: []].append(outcome.requestID)
        }
        #expect(outcomesByUser == expected)
        await harness.stop()
    }

    @Test("concurrent calls never exceed max-in-flight and reach it under load")
    func globalBound() async throws {
        let controller = RecordingController(latency: { _ in .milliseconds(20) })
        let harness = LoopHarness(configure: { $0.maxInFlight = 16 }, router: router(controller))
        harness.assign(partitions: 1)
        for index in 0..<400 { harness.feed(request(index, user: "user-\(index)")) }
        #expect(await harness.waitForFinished(400))
        #expect(controller.snapshot.maxRunning == 16)
        #expect(harness.statistics.peakInFlight == 16)
        await harness.stop()
    }

    @Test("a slow user does not block other users")
    func slowUser() async throws {
        let gate = Gate { $0.appUserId == "slow" }
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(configure: { $0.maxInFlight = 8 }, router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "slow"))
        harness.feed(request(1, user: "slow"))
        for index in 2..<202 { harness.feed(request(index, user: "user-\(index % 20)")) }
        // Everyone else finishes while the slow user's first call is still held.
        #expect(await eventually { harness.producer.outcomes().count == 200 })
        #expect(gate.waiting == 1)
        #expect(controller.snapshot.callsByUser["slow"] == ["req-0"])
        // Its records hold back the partition's committable offset: nothing past offset 0.
        #expect((harness.consumer.snapshot.stored.values.max() ?? 0) == 0)
        gate.open()
        #expect(await harness.waitForFinished(202))
        #expect(controller.snapshot.callsByUser["slow"] == ["req-0", "req-1"])
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 202 })
        await harness.stop()
    }

    @Test("a record handed out twice by the consumer is handled once")
    func redeliveredRecord() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        let first = request(0, user: "u")
        harness.feed(first)
        harness.feed(request(1, user: "v"))
        // The same offset 1 again, then the next one.
        harness.feed(
            KafkaMessage(
                topic: LoopHarness.topic, partition: 0, offset: 1, key: nil, value: request(1, user: "v").jsonBytes()))
        harness.feed(request(2, user: "w"))
        #expect(await harness.waitForFinished(3))
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 3 })
        #expect(harness.statistics.finished == 3 && controller.snapshot.calls == 3)
        await harness.stop()
    }

    @Test("every record handed out is released once it is done, also duplicates and records of revoked partitions")
    func recordsReleased() async throws {
        let gate = Gate()
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(configure: { $0.bufferCapacity = 50 }, router: router(controller))
        harness.assign(partitions: 2)
        for index in 0..<200 { harness.feed(request(index, user: "user-\(index % 150)"), partition: Int32(index % 2)) }
        // A duplicate request id: released without a call.
        harness.feed(request(7, user: "user-7"), partition: 1)
        #expect(await eventually { controller.snapshot.calls >= 1 })
        #expect(harness.admission.held == 201)
        gate.open()
        #expect(await harness.waitForFinished(201))
        #expect(await eventually { harness.admission.held == 0 })
        await harness.stop()
    }

    @Test("a new owner skips what the previous owner finished beyond its commit")
    func finishedByPreviousOwner() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        // The previous owner committed offset 2 with offsets 4 and 5 finished beyond it.
        harness.assign(partitions: 1, finished: [0: [4, 5]])
        for index in 0..<8 { harness.feed(request(index, user: "user-\(index)")) }
        #expect(await harness.waitForFinished(8))
        #expect(Set(controller.snapshot.callsByUser.values.flatMap { $0 }).isDisjoint(with: ["req-4", "req-5"]))
        #expect(controller.snapshot.calls == 6)
        #expect(harness.statistics.alreadyFinished == 2)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 8 })
        await harness.stop()
    }

    @Test("commits carry the finished offsets beyond the committed one")
    func commitMetadata() async throws {
        let gate = Gate { $0.requestId == "req-1" }
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        for index in 0..<6 { harness.feed(request(index, user: "user-\(index)")) }
        #expect(await eventually { harness.statistics.finished == 5 })
        let partition = KafkaTopicPartition(topic: LoopHarness.topic, partition: 0)
        // (An earlier commit at offset 1 may carry fewer: the one after the fifth finish carries all.)
        #expect(
            await eventually {
                let snapshot = harness.consumer.snapshot
                return snapshot.stored[partition] == 1
                    && FinishedOffsets.decode(snapshot.metadata[partition] ?? nil, committed: 1) == [2, 3, 4, 5]
            })
        gate.open()
        #expect(await eventually { harness.consumer.snapshot.stored[partition] == 6 })
        await harness.stop()
    }

    @Test("only the contiguous finished prefix is stored, whatever order records finish in")
    func contiguousOffsets() async throws {
        let gate = Gate { $0.requestId == "req-3" }
        let controller = RecordingController(gate: gate)
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        for index in 0..<10 { harness.feed(request(index, user: "user-\(index)")) }
        #expect(await eventually { harness.statistics.finished == 9 })
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 3 })
        // Commits keep coming while offset 3 is held; none passes it.
        try await Task.sleep(for: .milliseconds(100))
        #expect(harness.consumer.snapshot.storedHistory.allSatisfy { $0 <= 3 })
        gate.open()
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 10 })
        #expect(harness.consumer.snapshot.storedHistory == harness.consumer.snapshot.storedHistory.sorted())
        await harness.stop()
    }
}

@Suite("Dispatcher: outcomes, errors, duplicates and dead letters (no Kafka)")
struct DispatcherOutcomeTests {
    @Test("retryable errors are retried with backoff, then fail with a dead letter")
    func retriesThenFails() async throws {
        let busy = PurchaseControllerError.retryable("http_503", "busy")
        let controller = RecordingController(answer: { _ in throw busy })
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 3)
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.result == .failed && outcome.attempts == 3)
        #expect(outcome.error == .init(type: "http_503", message: "busy", retryable: true))
        let letter = try #require(harness.producer.deadLetters().first)
        #expect(letter.error.stage == .controller && letter.error.errorClass == "http_503" && letter.attempts == 3)
        #expect(letter.requestID == "req-0")
        #expect(letter.originalValue.bytes == request(0, user: "u").jsonBytes())
        #expect(letter.originalHeaders?.first?.key == "trace")
        await harness.stop()
    }

    @Test("a retryable error that then succeeds is one purchased outcome")
    func retryThenSucceed() async throws {
        let controller = RecordingController(answer: { request in
            if request.attempt < 2 { throw PurchaseControllerError.retryable("timeout", "slow") }
            return .purchased
        })
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(harness.producer.outcomes().map(\.result) == [.purchased])
        #expect(harness.producer.outcomes().first?.attempts == 2)
        #expect(harness.producer.deadLetters().isEmpty)
        await harness.stop()
    }

    @Test("any other error is final: one call, failed at once")
    func finalError() async throws {
        struct Declined: Error {}
        let controller = RecordingController(answer: { _ in throw Declined() })
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 1)
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.result == .failed && outcome.attempts == 1 && outcome.error?.retryable == false)
        #expect(outcome.error?.type == "Declined")
        await harness.stop()
    }

    @Test("a duplicate request id is neither called nor answered again")
    func duplicates() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        harness.feed(request(1, user: "u"))
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(3))
        #expect(controller.snapshot.calls == 2)
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-0", "req-1"])
        #expect(harness.statistics.duplicates == 1)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 3 })
        await harness.stop()
    }

    @Test("a product no route matches is not attempted and nothing is called")
    func noRoute() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller, routes: [.prefix("rc_")]))
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u", product: "sk_lifetime"))
        harness.feed(request(1, user: "u", product: "rc_pro"))
        #expect(await harness.waitForFinished(2))
        #expect(controller.snapshot.calls == 1)
        let outcomes = harness.producer.outcomes()
        #expect(outcomes.map(\.result) == [.notAttempted, .purchased])
        #expect(outcomes[0].attempts == 0 && outcomes[0].controller == nil)
        await harness.stop()
    }

    @Test("invalid records become dead letters with the reason; processing goes on")
    func invalidInput() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        harness.feed(Array("{not json".utf8), key: "k")
        harness.feed([0xFF, 0xFE], key: "k")
        var missing = String(decoding: request(5, user: "u").jsonBytes(), as: UTF8.self)
        missing = missing.replacingOccurrences(of: "\"product_id\"", with: "\"product\"")
        harness.feed(Array(missing.utf8), key: "app:u")
        harness.feed(request(9, user: "u"))
        #expect(await harness.waitForFinished(4))
        let letters = harness.producer.deadLetters()
        #expect(letters.map(\.error.errorClass) == ["not_json", "not_utf8", "missing_field"])
        #expect(letters.map(\.error.stage) == [.decode, .decode, .validate])
        #expect(letters[2].error.field == "product_id" && letters[2].requestID == "req-5")
        #expect(letters.map(\.originalOffset) == [0, 1, 2])
        #expect(letters[1].originalValue.encoding == .base64 && letters[1].originalValue.bytes == [0xFF, 0xFE])
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-9"])
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 4 })
        await harness.stop()
    }

    @Test("a hostile record (huge key, hundreds of large headers) still becomes a producible dead letter")
    func hostileRecord() async throws {
        let harness = LoopHarness(router: router(RecordingController()))
        harness.assign(partitions: 1)
        let headers = (0..<300).map { KafkaHeader(key: "h\($0)", value: [UInt8](repeating: 0xFF, count: 2_000)) }
        harness.feed(
            KafkaMessage(
                topic: LoopHarness.topic, partition: 0, offset: 0, key: [UInt8](repeating: 0x41, count: 100_000),
                value: Array("not json".utf8), headers: headers))
        #expect(await harness.waitForFinished(1))
        let record = try #require(harness.producer.produced.first { $0.topic == "encore.dead-letters" })
        // Under Kafka's default message.max.bytes, and readable by the contract's own decoder.
        #expect(record.value.count + record.headers.count * 64 < 1_000_000 && record.key == nil)
        let letter = try DeadLetterEvent(jsonBytes: record.value)
        #expect(
            letter.originalKeyTruncated && letter.originalKey?.text.count == DeadLetterEvent.maximumOriginalKeyBytes)
        #expect(
            letter.originalHeadersTruncated
                && letter.originalHeaders?.count == DeadLetterEvent.maximumOriginalHeaderBytes / 2_000)
        #expect(letter.error.stage == .decode)
        await harness.stop()
    }

    @Test("null in optional fields means absent: the request is processed, not dead-lettered")
    func nullOptionals() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        let value = """
            {"request_id": "req-null", "app_id": "app", "app_user_id": "u", "product_id": "rc_pro_monthly",
             "store": "APP_STORE", "environment": "SANDBOX", "requested_at_ms": 1764475643000,
             "placement_id": null, "promo_offer_id": null, "campaign_id": null, "offer_id": null,
             "entitlement": null, "deadline_at_ms": null, "attributes": null}
            """
        harness.feed(Array(value.utf8), key: "app:u")
        #expect(await harness.waitForFinished(1))
        let outcome = try #require(harness.producer.outcomes().first)
        #expect(outcome.requestID == "req-null" && outcome.result == .purchased && outcome.placementID == nil)
        #expect(harness.producer.deadLetters().isEmpty && controller.snapshot.calls == 1)
        await harness.stop()
    }

    @Test("a past deadline is not attempted")
    func deadline() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        var event = request(0, user: "u")
        event.deadlineAtMs = 1000
        harness.feed(event)
        #expect(await harness.waitForFinished(1))
        #expect(controller.snapshot.calls == 0)
        #expect(harness.producer.outcomes().first?.result == .notAttempted)
        #expect(harness.producer.outcomes().first?.error?.type == "deadline_exceeded")
        await harness.stop()
    }

    @Test("a failed delivery is produced again; the offset waits for it")
    func redelivery() async throws {
        let controller = RecordingController()
        let harness = LoopHarness(router: router(controller))
        harness.producer.failNext([KafkaError(code: .messageTimedOut, message: "broker away", isRetriable: true)])
        harness.assign(partitions: 1)
        harness.feed(request(0, user: "u"))
        #expect(await harness.waitForFinished(1))
        #expect(harness.producer.outcomes().map(\.requestID) == ["req-0"])
        #expect(controller.snapshot.calls == 1)
        #expect(await eventually { harness.consumer.snapshot.stored.values.first == 1 })
        await harness.stop()
    }

    @Test("outcomes carry the request's fields and CloudEvents headers")
    func outcomeRecord() async throws {
        let controller = RecordingController(answer: { _ in .pending })
        let harness = LoopHarness(router: router(controller))
        harness.assign(partitions: 1)
        var event = request(0, user: "u")
        event.placementID = "paywall"
        harness.feed(event)
        #expect(await harness.waitForFinished(1))
        let record = try #require(harness.producer.produced.first { $0.topic == "encore.purchase-outcomes" })
        #expect(record.key == Array("app:u".utf8))
        let headers = CloudEventHeaders(headers: record.headers.map { ($0.key, $0.stringValue) })
        #expect(headers?.eventType == .purchaseOutcome)
        #expect(headers?.id == "outcome:req-0")
        let outcome = try PurchaseOutcomeEvent(jsonBytes: record.value)
        #expect(outcome.result == .pending && outcome.placementID == "paywall" && outcome.controller == "recording")
        #expect(outcome.requestedAtMs == event.requestedAtMs && outcome.completedAtMs >= event.requestedAtMs)
        await harness.stop()
    }
}
