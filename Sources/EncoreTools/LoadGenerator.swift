import EncoreEvents
import Foundation
import Kafka
import Synchronization

/// Produces generated requests to a topic, optionally at a steady rate (token bucket).
public struct LoadGenerator: Sendable {
    /// Counters of a generation run.
    public struct Progress: Sendable {
        public var sent = 0
        public var acknowledged = 0
        public var errors = 0
        public var elapsed: Duration = .zero
        /// Time spent producing, without the final wait for acknowledgements.
        public var sendingTime: Duration = .zero
        public var duplicates = 0
        public var invalid = 0

        /// Acknowledged records per second so far.
        public var rate: Double {
            elapsed.seconds > 0 ? Double(acknowledged) / elapsed.seconds : 0
        }
    }

    public let producer: KafkaProducer
    public let topic: String
    /// The offered rate over time; `nil` produces as fast as the producer takes them.
    public let schedule: RateSchedule?
    public let source: String

    /// Records per second; 0 produces as fast as the producer takes them.
    public init(producer: KafkaProducer, topic: String, rate: Double = 0, source: String = "/encore-processor/generate")
    {
        self.init(producer: producer, topic: topic, schedule: rate > 0 ? RateSchedule(rate) : nil, source: source)
    }

    public init(producer: KafkaProducer, topic: String, schedule: RateSchedule?, source: String) {
        self.producer = producer
        self.topic = topic
        self.schedule = schedule
        self.source = source
    }

    /// Produces until `count` records were sent or `duration` passed, then waits for every
    /// acknowledgement. `report` is called about every `interval` and once at the end; `sent`
    /// with each record just before it is produced.
    public func run(
        generator: inout RequestGenerator, count: Int?, duration: Duration?, interval: Duration = .seconds(1),
        report: (Progress) -> Void = { _ in }, sent: (RequestGenerator.Record) -> Void = { _ in }
    ) async throws -> Progress {
        let counters = DeliveryCounters()
        // The first records would otherwise wait for the topic's metadata: a start-up stall that
        // a steady-rate measurement would count as processing latency.
        do {
            try await producer.prepare(topic: topic)
        } catch {
            Logger(label: "encore.generate").warning(
                "cannot read the metadata of '\(topic)' before producing: \(error)")
        }
        let clock = ContinuousClock()
        let start = clock.now
        var progress = Progress()
        var nextReport = start.advanced(by: interval)
        func snapshot() -> Progress {
            var current = progress
            (current.acknowledged, current.errors) = counters.values
            current.elapsed = clock.now - start
            return current
        }
        while count.map({ progress.sent < $0 }) ?? true {
            let now = clock.now
            if let duration, now - start >= duration {
                // A token bucket's budget accrues with time: a sender that fell behind (a busy
                // machine) catches up on what the window allowed before it stops.
                let owed = schedule.map { $0.allowed(at: duration.seconds) - progress.sent } ?? 0
                if owed <= 0 { break }
            }
            if now >= nextReport {
                report(snapshot())
                nextReport = now.advanced(by: interval)
            }
            if let schedule {
                let elapsed = (now - start).seconds
                if progress.sent >= schedule.allowed(at: elapsed) + 1 {
                    // At most a thousand wake-ups a second: each sleep costs a timer; what the window allows
                    // after it goes out together.
                    let rate = max(1, schedule.rate(at: elapsed))
                    try await Task.sleep(for: .microseconds(max(1000, Int(1_000_000 / rate / 2))))
                    continue
                }
            }
            let record = generator.next(nowMs: wallClockMs())
            switch record.kind {
            case .duplicate: progress.duplicates += 1
            case .invalid: progress.invalid += 1
            case .valid: break
            }
            let headers = CloudEventHeaders(
                id: record.requestID ?? "invalid-\(progress.sent)", source: source, type: .purchaseRequested,
                timeMs: wallClockMs()
            ).headers.map { KafkaHeader(key: $0.key, string: $0.value) }
            let producerRecord = KafkaProducerRecord(
                topic: topic, key: record.key, value: record.value, headers: headers)
            // Told before it is enqueued: its answer may come back before enqueue returns.
            sent(record)
            while !enqueue(producerRecord, counters: counters) {
                try await Task.sleep(for: .milliseconds(1))
            }
            progress.sent += 1
            if progress.sent % 1024 == 0 { await Task.yield() }
        }
        progress.sendingTime = clock.now - start
        try await producer.flush(timeout: .seconds(120))
        let final = snapshot()
        report(final)
        return final
    }
}

extension LoadGenerator {
    /// Enqueues `record`; `false` when the local queue is full. Other errors count as failed deliveries.
    fileprivate func enqueue(_ record: KafkaProducerRecord, counters: DeliveryCounters) -> Bool {
        do {
            try producer.produce(record) { counters.record($0) }
            return true
        } catch {
            if error.code == .queueFull { return false }
            counters.record(.failure(error))
            return true
        }
    }
}

private final class DeliveryCounters: Sendable {
    private let counts = Mutex<(acknowledged: Int, errors: Int)>((0, 0))

    func record(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        counts.withLock { counts in
            switch result {
            case .success: counts.acknowledged += 1
            case .failure: counts.errors += 1
            }
        }
    }

    var values: (Int, Int) { counts.withLock { ($0.acknowledged, $0.errors) } }
}

/// Milliseconds since the epoch.
public func wallClockMs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

extension Duration {
    /// The duration in seconds, as a floating-point number.
    public var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
