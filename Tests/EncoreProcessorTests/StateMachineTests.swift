import Kafka
import Testing

@testable import EncoreProcessor

@Suite("Lane scheduler")
struct LaneSchedulerTests {
    @Test("one running item per lane, FIFO within a lane, global bound across lanes")
    func lanes() {
        var scheduler = LaneScheduler<Int, String>(maxInFlight: 2)
        #expect(scheduler.enqueue(1, lane: "a") == 1)
        #expect(scheduler.enqueue(2, lane: "a") == nil)
        #expect(scheduler.enqueue(3, lane: "b") == 3)
        #expect(scheduler.enqueue(4, lane: "c") == nil)
        #expect(scheduler.inFlight == 2 && scheduler.count == 4)
        // "a" finishes: its next item waits behind "c", which asked first.
        #expect(scheduler.finish(lane: "a") == 4)
        #expect(scheduler.finish(lane: "b") == 2)
        #expect(scheduler.finish(lane: "c") == nil)
        #expect(scheduler.finish(lane: "a") == nil)
        #expect(scheduler.inFlight == 0 && scheduler.count == 0)
    }

    @Test("removing waiting items keeps running ones and the order of the rest")
    func removeWaiting() {
        var scheduler = LaneScheduler<Int, String>(maxInFlight: 1)
        _ = scheduler.enqueue(1, lane: "a")
        _ = scheduler.enqueue(2, lane: "a")
        _ = scheduler.enqueue(3, lane: "b")
        _ = scheduler.enqueue(4, lane: "b")
        #expect(scheduler.removeWaiting { $0 == 3 } == [3])
        #expect(scheduler.count == 3)
        #expect(scheduler.finish(lane: "a") == 4)
        #expect(scheduler.finish(lane: "b") == 2)
        #expect(scheduler.finish(lane: "a") == nil)
    }
}

@Suite("Offset tracker")
struct OffsetTrackerTests {
    static let partition = KafkaTopicPartition(topic: "t", partition: 0)

    @Test(
        "commits only the contiguous finished prefix",
        arguments: [
            ([0, 1, 2, 3], [1, 2, 3, 4]),
            ([3, 2, 1, 0], [nil, nil, nil, 4]),
            ([1, 0, 3, 2], [nil, 2, nil, 4]),
            ([0, 2, 3, 1], [1, nil, nil, 4]),
        ] as [([Int64], [Int64?])])
    func prefix(order: [Int64], expected: [Int64?]) {
        var tracker = OffsetTracker<KafkaTopicPartition>()
        for offset in 0..<4 { tracker.received(Self.partition, offset: Int64(offset)) }
        #expect(tracker.pendingCount == 4)
        #expect(order.map { tracker.finished(Self.partition, offset: $0) } == expected)
        #expect(tracker.pendingCount == 0)
    }

    @Test("offsets with gaps (compaction, transaction markers) advance past the gap")
    func gaps() {
        var tracker = OffsetTracker<KafkaTopicPartition>()
        for offset in [10, 11, 15, 20] as [Int64] { tracker.received(Self.partition, offset: offset) }
        #expect(tracker.finished(Self.partition, offset: 15) == nil)
        #expect(tracker.finished(Self.partition, offset: 10) == 11)
        #expect(tracker.finished(Self.partition, offset: 11) == 16)
        #expect(tracker.finished(Self.partition, offset: 20) == 21)
    }

    @Test("a removed partition forgets its records")
    func remove() {
        var tracker = OffsetTracker<KafkaTopicPartition>()
        tracker.received(Self.partition, offset: 0)
        tracker.received(KafkaTopicPartition(topic: "t", partition: 1), offset: 0)
        tracker.remove(Self.partition)
        #expect(tracker.pendingCount == 1)
        #expect(tracker.finished(Self.partition, offset: 0) == nil)
    }
}

@Suite("Policies")
struct PolicyTests {
    @Test("backoff doubles from the initial value, is jittered within [cap/2, cap] and capped")
    func backoff() {
        let policy = RetryPolicy(maxAttempts: 4, initialBackoff: .milliseconds(100), maxBackoff: .milliseconds(250))
        #expect(policy.backoff(after: 1, unit: 0) == .milliseconds(50))
        #expect(policy.backoff(after: 1, unit: 1) == .milliseconds(100))
        #expect(policy.backoff(after: 2, unit: 1) == .milliseconds(200))
        #expect(policy.backoff(after: 3, unit: 1) == .milliseconds(250))
        #expect(policy.allowsRetry(after: 3) && !policy.allowsRetry(after: 4))
    }

    @Test("workers share out the in-flight bound; statistics add up; partitions by number")
    func workerShares() throws {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        configuration.workers = 3
        configuration.maxInFlight = 1000
        configuration.bufferCapacity = 10
        let share = configuration.perWorker
        #expect(share.maxInFlight == 334)
        configuration.maxInFlight = 2
        #expect(throws: ProcessorError.self) { try configuration.validate() }

        var first = ProcessorStatistics()
        first.finished = 3
        first.outcomes = [.purchased: 2, .cancelled: 1]
        first.latency.record(10)
        first.firstReceivedAtMs = 100
        first.lastFinishedAtMs = 500
        var second = ProcessorStatistics()
        second.finished = 4
        second.outcomes = [.purchased: 4]
        second.latency.record(30)
        second.firstReceivedAtMs = 50
        second.lastFinishedAtMs = 400
        let total = ProcessorStatistics.combined([first, second])
        #expect(total.finished == 7 && total.outcomes == [.purchased: 6, .cancelled: 1])
        #expect(total.latency.count == 2 && total.latency.max == 30)
        #expect(total.firstReceivedAtMs == 50 && total.lastFinishedAtMs == 500)

        // Partitions go to workers by number; deliveries come back to the worker that produced.
        let router = WorkerRouter(count: 3)
        let split = router.split(Array(Int32(0)..<8), by: { $0 })
        #expect(split.map(\.worker) == [0, 1, 2] && split.map(\.items) == [[0, 3, 6], [1, 4, 7], [2, 5]])
        #expect(WorkerRouter(count: 1).split([Int32]([]), by: { $0 }).isEmpty)
        let deliveries = [UInt(7) * 3 + 2, 5 * 3 + 0, 9 * 3 + 2].map {
            KafkaDelivery(token: $0, error: nil, record: nil)
        }
        let back = WorkerProducer.split(deliveries, workers: 3)
        #expect(back.map(\.worker) == [0, 2] && back.map { $0.items.map(\.token) } == [[5], [7, 9]])
    }

    @Test("the ring-buffer queue keeps arrival order across wrap-around, growth and removal")
    func fifo() {
        var queue = FIFO<Int>()
        var model: [Int] = []
        var random = SystemRandomNumberGenerator()
        var next = 0
        func check() {
            #expect(queue.count == model.count && queue.first == model.first)
            if !model.isEmpty {
                let offset = Int.random(in: 0..<model.count, using: &random)
                #expect(queue[offset] == model[offset])
            }
        }
        func push() {
            queue.append(next)
            model.append(next)
            next += 1
        }
        func pop() {
            #expect(queue.popFirst() == model.first)
            if !model.isEmpty { model.removeFirst() }
        }
        // Random pushes and pops: the head wraps around many times and the buffer grows while wrapped.
        for _ in 0..<20_000 {
            if Int.random(in: 0..<5, using: &random) < 3 { push() } else { pop() }
            check()
        }
        // Emptied and refilled, 1 to 6 elements at a time: the first element is held apart from the ring.
        for round in 0..<2_000 {
            while !model.isEmpty {
                pop()
                check()
            }
            #expect(queue.isEmpty && queue.popFirst() == nil)
            for _ in 0...(round % 6) {
                push()
                check()
            }
        }
        let removed = queue.removeAll { $0 % 3 == 0 }
        #expect(removed == model.filter { $0 % 3 == 0 })
        model.removeAll { $0 % 3 == 0 }
        var rest: [Int] = []
        while let element = queue.popFirst() { rest.append(element) }
        #expect(rest == model && queue.isEmpty && queue.popFirst() == nil)
    }

    @Test("the queue keeps no element it handed out or removed, across growth and wrap-around")
    func fifoReleases() {
        final class Box {}
        var queue = FIFO<Box>()
        var handedOut: [() -> Box?] = []
        var random = SystemRandomNumberGenerator()
        for round in 0..<200 {
            for _ in 0..<Int.random(in: 1...9, using: &random) {
                let box = Box()
                handedOut.append { [weak box] in box }
                queue.append(box)
            }
            for _ in 0..<Int.random(in: 0...queue.count, using: &random) { _ = queue.popFirst() }
            if round % 50 == 49 { _ = queue.removeAll { _ in Bool.random(using: &random) } }
        }
        while queue.popFirst() != nil {}
        #expect(handedOut.allSatisfy { $0() == nil }, "an element outlived its queue's hold on it")
    }

    @Test("an array emptied in order hands out every element once, in its first order, and keeps none")
    func removedInOrder() {
        final class Box {
            let value: Int
            init(_ value: Int) { self.value = value }
        }
        for count in [0, 1, 2, 7, 64] {
            var boxes = (0..<count).map { Box($0) }
            let watched = boxes.map { box in { [weak box] in box } }
            var order: [Int] = []
            boxes.removeAllInOrder { order.append($0.value) }
            #expect(order == Array(0..<count) && boxes.isEmpty, "\(count) elements")
            #expect(watched.allSatisfy { $0() == nil }, "an element outlived the array (\(count) elements)")
        }
    }

    @Test("the histogram's percentiles are within 2% of the true values")
    func histogram() {
        var histogram = LatencyHistogram()
        for value in 1...100_000 { histogram.record(UInt64(value)) }
        for q in [0.5, 0.9, 0.99, 0.999] {
            let truth = q * 100_000
            #expect(abs(Double(histogram.percentile(q)) - truth) / truth < 0.02, "p\(q)")
        }
        #expect(histogram.max == 100_000 && histogram.count == 100_000)
    }
}

@Suite("Router")
struct RouterTests {
    @Test("first matching rule wins; no match means no controller")
    func firstMatch() {
        var router = PurchaseRouter()
        router.register("rc", ClosureController { _ in .purchased })
        router.register("sk", ClosureController { _ in .cancelled })
        router.route(.exact("rc_special"), to: "sk")
        router.route(.prefix("rc_"), to: "rc")
        router.route(.prefix("sk_"), to: "sk")
        #expect(router.controller(for: "rc_special")?.name == "sk")
        #expect(router.controller(for: "rc_pro")?.name == "rc")
        #expect(router.controller(for: "sk_life")?.name == "sk")
        #expect(router.controller(for: "com.app.x") == nil)
        router.route(.prefix("x"), to: "missing")
        #expect(router.unregisteredNames == ["missing"])
    }

    @Test(
        "route flags parse",
        arguments: [
            ("rc_=revenuecat", PurchaseRouter.Match.prefix("rc_"), "revenuecat"),
            ("=com.app.pro=billing", .exact("com.app.pro"), "billing"),
            ("*=all", .any, "all"),
        ])
    func parse(text: String, match: PurchaseRouter.Match, name: String) throws {
        let rule = try #require(PurchaseRouter.parseRoute(text))
        #expect(rule.match == match && rule.controllerName == name)
    }

    @Test("malformed route flags are refused", arguments: ["rc_", "=x", "rc_=", "=="])
    func malformed(text: String) {
        #expect(PurchaseRouter.parseRoute(text) == nil)
    }
}

@Suite("Finished offsets in commit metadata")
struct FinishedOffsetsTests {
    @Test("encodes and decodes the offsets above the commit; ignores foreign metadata")
    func roundTrip() {
        let finished: Set<Int64> = [101, 102, 110, 5000]
        let metadata = FinishedOffsets.encode(committed: 100, finished: finished + [99, 100])
        #expect(metadata?.hasPrefix("encore1:") == true)
        #expect(FinishedOffsets.decode(metadata, committed: 100) == finished)
        #expect(FinishedOffsets.encode(committed: 7, finished: []) == nil)
        #expect(FinishedOffsets.decode("written by someone else", committed: 3).isEmpty)
        #expect(FinishedOffsets.decode(nil, committed: 3).isEmpty)
    }

    @Test("offsets past the bitmap's reach are left out, so they are redone rather than lost")
    func bounded() {
        let far = Int64(FinishedOffsets.maximumBitmapBytes * 8 + 10)
        let metadata = FinishedOffsets.encode(committed: 0, finished: [1, far])
        #expect(FinishedOffsets.decode(metadata, committed: 0) == [1])
    }
}
