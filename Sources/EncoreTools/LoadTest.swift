import EncoreEvents
import Foundation
import Kafka
import Synchronization

/// Measures a running deployment from the outside: produces generated requests at an offered rate
/// (steady or a ramp) into its requests topic and reads its outcomes and dead-letter topics from
/// their ends, matching outcomes to requests by `request_id`. Joins no group, commits nothing.
public enum LoadTest {
    public struct Options: Sendable {
        /// The deployment's cluster (`bootstrap.servers` and any client settings).
        public var kafka: KafkaConfiguration
        /// The deployment's topics: requests are produced to the first, the others are read.
        public var requestsTopic = "encore.purchase-requests"
        public var outcomesTopic = "encore.purchase-outcomes"
        public var deadLetterTopic = "encore.dead-letters"
        /// The offered rate: steady, or a ramp over `duration`.
        public var schedule: RateSchedule
        public var duration: Duration
        /// How long to wait for stragglers once production ended.
        public var grace: Duration = .seconds(30)
        /// The length of a window of the live lines, the charts and the knee.
        public var window: Duration = .seconds(5)
        /// What the requests look like (users, products, duplicates, invalid records, seed).
        public var generator = RequestGenerator.Options()
        public var slo = SLO()
        /// Marks every request (`attributes.encore_loadtest_run`) and prefixes its id.
        public var runID: String

        public init(kafka: KafkaConfiguration, schedule: RateSchedule, duration: Duration, runID: String) {
            self.kafka = kafka
            self.schedule = schedule
            self.duration = duration
            self.runID = runID
        }
    }

    /// What the run must show to pass.
    public struct SLO: Sendable, Hashable {
        /// The largest p99 request-to-outcome latency allowed, in milliseconds (the knee's bound in a ramp).
        public var p99Ms: Double? = nil
        /// The most requests allowed without an outcome.
        public var missing = 0
        public init() {}
    }

    /// One window of the run: what was offered and answered in it.
    public struct Window: Sendable {
        /// Seconds since the start of production, and the window's length.
        public var start: Double
        public var length: Double
        /// The schedule's rate at the window's middle.
        public var offeredRate: Double
        /// Records produced in the window, and the valid requests among them (duplicates and
        /// invalid records get no outcome of their own).
        public var sent = 0
        public var validSent = 0
        /// Outcomes of this run's requests seen in the window.
        public var answered = 0
        /// Dead letters of this run's records, and outcomes by result, seen in the window.
        public var deadLetters = 0
        public var results: [String: Int] = [:]
        /// Latencies of the outcomes seen in the window (microseconds; two significant digits, so
        /// that an hour of windows stays within tens of megabytes).
        public var seen = HdrHistogram(significantDigits: 2)
        /// Latencies of the requests produced in the window, whenever answered: what the rate offered
        /// in the window cost (the knee's measure).
        public var ofSent = HdrHistogram(significantDigits: 2)

        /// The run ended inside the window: `length` is the part of it the run lasted, and its rates
        /// are per second of that part.
        public var partial = false

        /// Outcomes seen per second of the window.
        public var achievedRate: Double { length > 0 ? Double(answered) / length : 0 }

        /// The windows of a run that ended `end` seconds after its start, having produced for
        /// `productionSeconds`: nothing offered after production, and the last window cut to the part
        /// the run lasted (marked ``partial``), or left out when the run ended before anything happened
        /// in it (a window opened by the end of the one before). A window cut short would otherwise
        /// read as a fall of the achieved rate, its outcomes counted over a time the run did not last.
        static func closing(
            _ windows: [Window], endedAt end: Double, productionSeconds: Double, schedule: RateSchedule
        ) -> [Window] {
            var windows = windows
            for index in windows.indices where windows[index].start >= productionSeconds {
                windows[index].offeredRate = 0
            }
            guard var last = windows.popLast() else { return [] }
            let lasted = end - last.start
            guard lasted < last.length else { return windows + [last] }
            guard last.sent > 0 || last.answered > 0 || last.deadLetters > 0 else { return windows }
            last.length = max(lasted, 0.001)
            last.partial = true
            if last.start < productionSeconds { last.offeredRate = schedule.rate(at: last.start + last.length / 2) }
            return windows + [last]
        }
    }

    /// A live line's figures, reported once a window ends.
    public struct Progress: Sendable {
        public var elapsed: Double
        public var window: Window
        public var sent: Int
        public var answered: Int
        public var outstanding: Int
        public var deadLetters: Int
    }

    /// Runs the load test; `progress` is called at the end of every window (production and grace).
    public static func run(
        _ options: Options, logger: Logger = Logger(label: "encore.loadtest"),
        progress: @escaping @Sendable (Progress) -> Void = { _ in }
    ) async throws -> LoadTestReport {
        var generatorOptions = options.generator
        generatorOptions.requestIDPrefix = "lt-\(options.runID)"
        generatorOptions.attributes[PurchaseRequestEvent.loadTestRunAttribute] = options.runID
        let tracker = LoadTestTracker(window: options.window.seconds, schedule: options.schedule)
        // Read from the current ends: fetched before the first request is produced, so no outcome
        // of this run can fall before them.
        let reader = try await OutcomeReader.start(options: options, tracker: tracker)
        let producer: KafkaProducer
        do {
            producer = try KafkaProducer(configuration: options.kafka)
            // The generator's clock starts after its metadata fetch; the windows' with it.
            _ = try await producer.prepare(topic: options.requestsTopic)
        } catch {
            await reader.stop()
            throw error
        }
        let startedAt = Date()
        tracker.start()
        var generator = RequestGenerator(options: generatorOptions)
        let windowSeconds = options.window.seconds
        let reporter = Task {
            var next = 1
            while !Task.isCancelled {
                let due = Double(next) * windowSeconds - tracker.elapsed
                if due > 0 { try? await Task.sleep(for: .milliseconds(Int(due * 1000) + 1)) }
                if Task.isCancelled { break }
                progress(tracker.progress(ofWindow: next - 1))
                next += 1
            }
        }
        let produced: LoadGenerator.Progress
        do {
            produced = try await LoadGenerator(
                producer: producer, topic: options.requestsTopic, schedule: options.schedule,
                source: "/encore-processor/loadtest/\(options.runID)"
            ).run(generator: &generator, count: nil, duration: options.duration, sent: { tracker.sent($0) })
            await producer.close()
            let graceDeadline = ContinuousClock.now.advanced(by: options.grace)
            while tracker.outstanding > 0 && ContinuousClock.now < graceDeadline {
                try await Task.sleep(for: .milliseconds(20))
            }
        } catch {
            reporter.cancel()
            await reporter.value
            await reader.stop()
            await producer.close(timeout: .seconds(1))
            throw error
        }
        reporter.cancel()
        await reporter.value
        await reader.stop()
        return tracker.report(
            options: options, startedAt: startedAt, productionSeconds: produced.sendingTime.seconds,
            acknowledged: produced.acknowledged, produceErrors: produced.errors)
    }
}

/// The run's counts, shared by the producing loop, the outcome reader and the reporter.
final class LoadTestTracker: Sendable {
    private struct State {
        var startedAt = ContinuousClock.now
        /// Unique valid requests produced: id to requested_at_ms and window produced in.
        var sent: [String: (requestedAtMs: Int64, window: Int)] = [:]
        var duplicatesSent = 0
        var invalidSent = 0
        /// Outcomes seen per request id of this run.
        var outcomes: [String: Int] = [:]
        var results: [String: Int] = [:]
        /// Requests whose outcomes so far are one `pending` with `outcome_unknown`, and how many
        /// went in doubt and were resolved by their one final outcome.
        var inDoubt = Set<String>()
        var inDoubtOpened = 0
        var inDoubtResolved = 0
        var deadLetters = 0
        var total = HdrHistogram()
        var windows: [LoadTest.Window] = []
        /// Seconds from the start to the latest first outcome of a request.
        var lastAnsweredAt = 0.0
    }

    private let state = Mutex(State())
    private let windowSeconds: Double
    private let schedule: RateSchedule

    init(window: Double, schedule: RateSchedule) {
        windowSeconds = window
        self.schedule = schedule
    }

    func start() { state.withLock { $0.startedAt = ContinuousClock.now } }

    var elapsed: Double { state.withLock { (ContinuousClock.now - $0.startedAt).seconds } }

    /// Valid requests produced and not answered yet.
    var outstanding: Int { state.withLock { $0.sent.count - $0.outcomes.count } }

    private func windowIndex(_ state: inout State) -> Int {
        let index = max(0, Int((ContinuousClock.now - state.startedAt).seconds / windowSeconds))
        while state.windows.count <= index {
            let start = Double(state.windows.count) * windowSeconds
            state.windows.append(
                LoadTest.Window(
                    start: start, length: windowSeconds,
                    offeredRate: schedule.rate(at: start + windowSeconds / 2)))
        }
        return index
    }

    func sent(_ record: RequestGenerator.Record) {
        state.withLock { state in
            let window = windowIndex(&state)
            state.windows[window].sent += 1
            switch record.kind {
            case .valid:
                state.windows[window].validSent += 1
                if let id = record.requestID { state.sent[id] = (record.requestedAtMs, window) }
            case .duplicate: state.duplicatesSent += 1
            case .invalid: state.invalidSent += 1
            }
        }
    }

    /// An outcome read from the outcomes topic; others than this run's are ignored.
    func outcome(requestID: String, result: OutcomeResult, pendingReason: PendingReason?, seenAtMs: Int64) {
        state.withLock { state in
            guard let request = state.sent[requestID] else { return }
            let window = windowIndex(&state)
            let inDoubt = result == .pending && pendingReason == .outcomeUnknown
            if !inDoubt, state.inDoubt.remove(requestID) != nil {
                // The in-doubt request's one final outcome: no repeat.
                state.inDoubtResolved += 1
                return
            }
            let count = state.outcomes[requestID, default: 0]
            state.outcomes[requestID] = count + 1
            if count == 0, inDoubt {
                state.inDoubt.insert(requestID)
                state.inDoubtOpened += 1
            }
            let result = result.rawValue
            // A repeat is counted (duplicates), not measured again.
            guard count == 0 else { return }
            let latency = max(0, seenAtMs - request.requestedAtMs) * 1000
            state.results[result, default: 0] += 1
            state.total.record(latency)
            state.lastAnsweredAt = (ContinuousClock.now - state.startedAt).seconds
            state.windows[window].answered += 1
            state.windows[window].results[result, default: 0] += 1
            state.windows[window].seen.record(latency)
            state.windows[request.window].ofSent.record(latency)
        }
    }

    func deadLetter() {
        state.withLock { state in
            let window = windowIndex(&state)
            state.deadLetters += 1
            state.windows[window].deadLetters += 1
        }
    }

    func progress(ofWindow index: Int) -> LoadTest.Progress {
        state.withLock { state in
            _ = windowIndex(&state)
            let window = state.windows[min(index, state.windows.count - 1)]
            return LoadTest.Progress(
                elapsed: (ContinuousClock.now - state.startedAt).seconds, window: window,
                sent: state.sent.count + state.duplicatesSent + state.invalidSent, answered: state.outcomes.count,
                outstanding: state.sent.count - state.outcomes.count, deadLetters: state.deadLetters)
        }
    }

    func report(
        options: LoadTest.Options, startedAt: Date, productionSeconds: Double, acknowledged: Int, produceErrors: Int
    ) -> LoadTestReport {
        state.withLock { state in
            let missing = state.sent.keys.filter { state.outcomes[$0] == nil }.sorted()
            let windows = LoadTest.Window.closing(
                state.windows, endedAt: (ContinuousClock.now - state.startedAt).seconds,
                productionSeconds: productionSeconds, schedule: schedule)
            return LoadTestReport(
                runID: options.runID, startedAt: startedAt, schedule: options.schedule,
                durationSeconds: options.duration.seconds, productionSeconds: productionSeconds,
                sent: state.sent.count + state.duplicatesSent + state.invalidSent, acknowledged: acknowledged,
                produceErrors: produceErrors, validSent: state.sent.count, duplicatesSent: state.duplicatesSent,
                invalidSent: state.invalidSent, answered: state.outcomes.count, missing: missing.count,
                missingExamples: Array(missing.prefix(20)),
                duplicateOutcomes: state.outcomes.values.reduce(0) { $0 + max(0, $1 - 1) }, results: state.results,
                inDoubt: (state.inDoubtOpened, state.inDoubtResolved, state.inDoubt.count),
                deadLetters: state.deadLetters, latency: state.total, windows: windows,
                lastAnsweredSeconds: state.lastAnsweredAt, slo: options.slo)
        }
    }
}

/// Reads the outcomes and dead-letter topics from their ends at the start, without a group.
private final class OutcomeReader: Sendable {
    private let consumer: KafkaConsumer
    private let task: Task<Void, Never>

    private init(consumer: KafkaConsumer, task: Task<Void, Never>) {
        self.consumer = consumer
        self.task = task
    }

    static func start(options: LoadTest.Options, tracker: LoadTestTracker) async throws -> OutcomeReader {
        var configuration = options.kafka
        // Assigned, never subscribed: the group id only names the client; nothing is committed.
        configuration.setDefault("group.id", "encore-loadtest-\(options.runID)")
        configuration["enable.auto.commit"] = "false"
        configuration.setDefault("fetch.wait.max.ms", "10")
        if LibrdkafkaVersion.isAtLeast(2, 1) { configuration.setDefault("fetch.queue.backoff.ms", "10") }
        var adminConfiguration = options.kafka
        adminConfiguration["allow.auto.create.topics"] = "false"
        let admin = try KafkaAdmin(configuration: adminConfiguration)
        var starts: [KafkaTopicPartitionOffset] = []
        for topic in [options.requestsTopic, options.outcomesTopic, options.deadLetterTopic] {
            guard let partitions = try await admin.partitionCount(of: topic) else {
                throw KafkaError(code: .unknownTopicOrPartition, message: "the topic '\(topic)' does not exist")
            }
            guard topic != options.requestsTopic else { continue }
            for partition in 0..<Int32(partitions) {
                let marks = try await admin.watermarks(of: KafkaTopicPartition(topic: topic, partition: partition))
                starts.append(KafkaTopicPartitionOffset(topic: topic, partition: partition, offset: marks.high))
            }
        }
        let consumer = try KafkaConsumer(configuration: configuration, logger: Logger(label: "encore.loadtest.reader"))
        try consumer.assign(starts)
        let (outcomesTopic, source) = (options.outcomesTopic, "/encore-processor/loadtest/\(options.runID)")
        let task = Task {
            for await event in consumer.events {
                guard case .messages(let batch) = event else { continue }
                let seenAtMs = wallClockMs()
                for message in batch {
                    if message.topic == outcomesTopic {
                        guard let outcome = try? PurchaseOutcomeEvent(jsonBytes: message.value) else { continue }
                        tracker.outcome(
                            requestID: outcome.requestID, result: outcome.result,
                            pendingReason: outcome.pendingReason, seenAtMs: seenAtMs)
                    } else if let letter = try? DeadLetterEvent(jsonBytes: message.value),
                        letter.originalHeaders?.contains(where: { $0.key == "ce_source" && $0.value?.text == source })
                            ?? false
                    {
                        // The original record's CloudEvents source names the run, whatever its value held.
                        tracker.deadLetter()
                    }
                }
            }
        }
        return OutcomeReader(consumer: consumer, task: task)
    }

    func stop() async {
        await consumer.close()
        await task.value
    }
}
