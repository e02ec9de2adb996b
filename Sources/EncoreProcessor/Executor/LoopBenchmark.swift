import EncoreEvents
import Foundation
import Kafka
import Synchronization

/// One worker alone, without a broker (`bench --no-kafka`): contract requests through one
/// ``WorkerExecutor`` (and its ``Worker``) with the 0 ms simulated controller and the ledger and journal on, their
/// outputs taken as a producer would and acknowledged in batches: what the loop itself costs,
/// without a broker's round trips (which vary a lot from run to run) in the figure.
public enum LoopBenchmark {
    public struct Options: Sendable {
        public var count = 100_000
        public var users = 10_000
        public var maxInFlight = 256
        public var journalPerUserCap = JournalPolicy().perUserCap
        /// Given up after this long: the report then says how many finished.
        public var timeout: Duration = .seconds(600)

        public init() {}
    }

    public struct Report: Sendable {
        public let processed: Int
        public let outcomes: Int
        /// CPU of the whole process over the run (the loop, the decoding, the acknowledging thread).
        public let cpuSeconds: Double
        public let elapsedSeconds: Double
        /// Requests the journal remembers at the end, and about how many bytes each takes.
        public let rememberedRequests: Int
        public let journalBytesPerRequest: Double
        /// Resident memory at the end, and once the allocator handed back what it holds freed (as
        /// the processor does every 10 s).
        public let residentMegabytes: Double
        public let residentMegabytesAfterReturn: Double
        /// The allocator that answered that return: "jemalloc", "glibc" or "none".
        public let allocator: String

        public var cpuMicrosecondsPerRequest: Double { cpuSeconds / Double(max(1, processed)) * 1e6 }
        public var throughput: Double { Double(processed) / max(elapsedSeconds, 1e-9) }
    }

    static let partitions: Int32 = 4

    public static func run(_ options: Options) async -> Report {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        configuration.maxInFlight = options.maxInFlight
        configuration.journal.perUserCap = options.journalPerUserCap
        var router = PurchaseRouter()
        router.register("simulated", SimulatedController(weights: [(.purchased, 1)], allowsProduction: true))
        router.route(.any, to: "simulated")
        let inbox = Inbox<ProcessorInput>()
        let producer = AcknowledgingProducer(inbox: inbox)
        let recorder = StatisticsRecorder()
        let admission = KafkaAdmission(capacity: configuration.bufferCapacity)
        let loop = WorkerExecutor(
            configuration: configuration, router: router, recorder: recorder, consumer: NoConsumer(),
            producer: producer, inbox: inbox, admission: admission, logger: Logger(label: "encore.bench"))
        // The loop lives in this task; what its journal remembers is read there at the end.
        let pump = Task { [loop] in
            await loop.run()
            return loop.worker.ledger.journalFigures
        }
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(5))
                inbox.post(.tick)
            }
        }
        let topic = configuration.requestsTopic
        inbox.post(
            .assigned(
                (0..<partitions).map { KafkaTopicPartition(topic: topic, partition: $0) }, finished: [:], restored: [:],
                committed: [:])
        )
        // Encoded before the clock starts, as a broker would hold them; a user's on one partition.
        var nextOffsets = [Int64](repeating: 0, count: Int(partitions))
        let messages = (0..<options.count).map { index in
            let (event, user) = limitRequest(index, users: options.users)
            let partition = user % Int(partitions)
            defer { nextOffsets[partition] += 1 }
            return KafkaMessage(
                topic: topic, partition: Int32(partition), offset: nextOffsets[partition], key: Array(event.key.utf8),
                value: event.jsonBytes(), headers: [])
        }
        let cpuBefore = processCPUSeconds()
        let started = ContinuousClock.now
        let deadline = started.advanced(by: options.timeout)
        var fed = 0
        while fed < messages.count, ContinuousClock.now < deadline {
            // Batches of 500, as a consumer hands them out, no further ahead than the buffer allows.
            let batch = messages[fed..<min(messages.count, fed + 500)]
            admission.admit(batch.count)
            inbox.post(.records(batch.map { IncomingRecord(message: $0, isSource: false) }))
            fed += batch.count
            // Looked at every millisecond: the loop publishes its count on its 5 ms tick, and half
            // the buffer (2,500 records) is tens of milliseconds of its work. (Looked at every
            // 200 µs, the waking cost about a tenth of the CPU counted here, none of it the loop's:
            // twelve interleaved pairs, median 15.6 µs a request against 14.1.)
            while fed - recorder.snapshot.finished > configuration.bufferCapacity / 2, ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(1))
            }
        }
        while recorder.snapshot.finished < messages.count, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(1))
        }
        let elapsed = ContinuousClock.now - started
        let cpu = processCPUSeconds() - cpuBefore
        inbox.post(.shutdown)
        let journal = await pump.value
        ticker.cancel()
        producer.stop()
        let statistics = recorder.snapshot
        let residentBefore = Double(ProcessResources.current().residentBytes) / 1e6
        let returned = ProcessResources.returnFreedMemory()
        let residentAfter = Double(ProcessResources.current().residentBytes) / 1e6
        return Report(
            processed: statistics.finished, outcomes: statistics.outcomes.values.reduce(0, +), cpuSeconds: cpu,
            elapsedSeconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18,
            rememberedRequests: journal.requests, journalBytesPerRequest: journal.bytesPerRequest,
            residentMegabytes: residentBefore, residentMegabytesAfterReturn: residentAfter,
            allocator: returned.description)
    }

    /// Request `index` as `../shared/bench/limit.c fill` writes it for `make bench`'s rows: a
    /// UUID-shaped request id and a product id too long to be stored inline in a `String` (as in
    /// production), users drawn by the same hash, an empty `pad` attribute (limit.c pads to 250
    /// bytes, which these 273 already exceed).
    static func limitRequest(_ index: Int, users: Int) -> (event: PurchaseRequestEvent, user: Int) {
        let user = Int(mix64(UInt64(index)) % UInt64(users))
        let hash = mix64(UInt64(index) ^ 0x5eed)
        func hex(_ value: UInt64, _ digits: Int) -> String {
            let text = String(value, radix: 16)
            return String(repeating: "0", count: max(0, digits - text.count)) + text
        }
        let requestID =
            "\(hex(hash >> 32, 8))-\(hex((hash >> 16) & 0xffff, 4))-4\(hex((hash >> 4) & 0xfff, 3))-8\(hex(hash & 0xfff, 3))-"
            + hex(UInt64(index) & 0xffff_ffff_ffff, 12)
        let userText = String(user)
        let event = PurchaseRequestEvent(
            requestID: requestID, appID: "app_bench",
            appUserID: "user-" + String(repeating: "0", count: max(0, 6 - userText.count)) + userText,
            productID: "com.app.monthly_premium", store: .appStore, environment: .production,
            requestedAtMs: 1_796_000_000_000 + Int64(index), placementID: "cancel_flow", attributes: ["pad": ""])
        return (event, user)
    }

    /// limit.c's `mix64` (SplitMix64's finalizer).
    private static func mix64(_ value: UInt64) -> UInt64 {
        var x = value &+ 0x9e37_79b9_7f4a_7c15
        x = (x ^ (x >> 30)) &* 0xbf58_476d_1ce4_e5b9
        x = (x ^ (x >> 27)) &* 0x94d0_49bb_1331_11eb
        return x ^ (x >> 31)
    }

    static func processCPUSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        let user = Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
        return user + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }
}

/// Takes records as librdkafka would (it keeps nothing of them here) and acknowledges them from a
/// thread of its own every half millisecond, in batches, as librdkafka's delivery reports come.
private final class AcknowledgingProducer: OutputProducer {
    private let pending = Mutex<[UInt]>([])
    private let stopped = Atomic<Bool>(false)

    init(inbox: Inbox<ProcessorInput>) {
        Thread { [self] in
            while !stopped.load(ordering: .relaxed) {
                usleep(500)
                let tokens = pending.withLock { $0.takeAll() }
                guard !tokens.isEmpty else { continue }
                inbox.post(.delivered(tokens.map { KafkaDelivery(token: $0, error: nil, record: nil) }))
            }
        }.start()
    }

    func produce(_ buffer: borrowing KafkaRecordBuffer, token: UInt) throws(KafkaError) {
        pending.withLock { $0.append(token) }
    }

    func stop() { stopped.store(true, ordering: .relaxed) }
}

/// Commits nothing anywhere: the benchmark has no group.
private struct NoConsumer: ConsumerControl {
    func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError) {}
    func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {}
}
