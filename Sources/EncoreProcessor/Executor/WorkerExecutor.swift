import EncoreEvents
import Kafka

/// Runs one ``Worker``: feeds it its inbox with the time, and carries out what it decides (calls,
/// outputs, commits, pauses, hand-overs, log lines), posting every effect's result back to the
/// inbox. It decides nothing itself. Created, run and ended by one task of
/// ``PurchaseProcessor/run()``, of the tests' harness or of `bench --no-kafka`; never shared.
final class WorkerExecutor {
    private(set) var worker: Worker
    let recorder: StatisticsRecorder
    let consumer: any ConsumerControl
    let producer: any OutputProducer
    let inbox: Inbox<ProcessorInput>
    let admission: KafkaAdmission
    let logger: Logger
    let committer: (any TransactionCommitter)?
    let encoder: OutputEncoder
    /// The buffer every output is encoded into, in turn (the producer copies it).
    private var recordBuffer = KafkaRecordBuffer()
    let clock = ContinuousClock()
    /// The running attempt of each call, to cancel it.
    private var running: [Int: (attempt: Int, task: Task<Void, Never>)] = [:]
    /// Calls the controller answered without suspending (``PurchaseController/immediateAnswer(to:)``):
    /// handled after the input that launched them, with no task and no trip through the inbox.
    private var answered: [ProcessorInput] = []
    private var actions: [WorkerAction] = []
    private var commitTask: Task<Void, Never>? = nil
    private var transactionCommit: Task<KafkaError?, Never>? = nil

    var failure: ProcessorError? { worker.failure }
    /// Every owned partition's commit position: what shutdown commits last.
    var finalCommitOffsets: [KafkaTopicPartitionOffset] { worker.finalCommitOffsets }

    init(
        configuration: ProcessorConfiguration, router: PurchaseRouter, recorder: StatisticsRecorder,
        consumer: any ConsumerControl, producer: any OutputProducer, inbox: Inbox<ProcessorInput>,
        admission: KafkaAdmission, logger: Logger, committer: (any TransactionCommitter)? = nil,
        userSource: (any UserStateSource)? = nil
    ) {
        worker = Worker(
            configuration: configuration, router: router, transactional: committer != nil, now: .now,
            nowMs: currentTimeMs(), seed: UInt64.random(in: 0...UInt64.max), logsDebug: logger.isEnabled(.debug),
            userSource: userSource)
        (self.recorder, self.consumer, self.producer) = (recorder, consumer, producer)
        (self.inbox, self.admission, self.logger, self.committer) = (inbox, admission, logger, committer)
        encoder = OutputEncoder(configuration: configuration)
    }

    /// The one driver of a worker, in production, the tests and `bench --no-kafka`: handles its
    /// inbox until the worker is finished, then ends it as every worker ends: calls still running
    /// are cancelled (its outputs were produced as they were decided), the commit in flight
    /// returns, and an open transaction aborts. `stopped` runs as soon as inputs are no longer
    /// handled, and `beforeAbort` before the transaction's abort (which may wait on the broker).
    func run(stopped: () -> Void = {}, beforeAbort: () -> Void = {}) async {
        while !worker.isFinished { handle(await inbox.next()) }
        stopped()
        for call in running.values { call.task.cancel() }
        await commitTask?.value
        // (`.some(nil)`: a commit was in flight and committed; `nil`: none was.)
        var commit: KafkaError?? = nil
        if let transactionCommit { commit = .some(await transactionCommit.value) }
        beforeAbort()
        let aborts = worker.endTransaction(commit: commit)
        execute()
        guard aborts, let committer else { return }
        do {
            try await committer.abort()
            worker.transactionAborted()
            execute()
        } catch {
            logger.error(
                "cannot abort the open transaction (\(error)): read_committed readers wait for it up to transaction.timeout.ms"
            )
        }
        recorder.publish(worker.statistics)
    }

    /// Handles a batch of inputs, then what the batch as a whole decides.
    func handle(_ batch: consuming [ProcessorInput]) {
        // (Moved out: the worker moves the records on into their work items.)
        batch.removeAllInOrder { feed($0) }
        worker.endBatch(now: clock.now, nowMs: currentTimeMs())
        execute()
        // A hand-over or drain may have started calls that were answered at once.
        if feedAnswered() {
            worker.flushOutputs()
            execute()
        }
    }

    private func feed(_ input: consuming ProcessorInput) {
        switch input {
        case .attemptFinished(let id, let attempt, _, _) where running[id]?.attempt == attempt: running[id] = nil
        // Returned: only a commit still in flight when the worker finishes is awaited.
        case .commitFinished: commitTask = nil
        case .transactionFinished: transactionCommit = nil
        default: break
        }
        worker.handle(input, now: clock.now, nowMs: currentTimeMs())
        execute()
        _ = feedAnswered()
    }

    /// Feeds the calls answered at once (and those their handling launched); whether there were any.
    private func feedAnswered() -> Bool {
        guard !answered.isEmpty else { return false }
        while !answered.isEmpty {
            for answer in answered.takeAll() {
                worker.handle(answer, now: clock.now, nowMs: currentTimeMs())
                execute()
            }
        }
        return true
    }

    /// Carries out the worker's actions, in order.
    private func execute() {
        worker.takeActions(into: &actions)
        actions.removeAllInOrder { action in
            switch consume action {
            case .call(let id, let attempt, let request, let controller): call(id, attempt, request, controller)
            case .cancelCall(let id): running[id]?.task.cancel()
            case .produce(let outputs): produce(outputs)
            case .pause(let partitions):
                do {
                    try consumer.pause(partitions)
                } catch {
                    logger.warning("cannot pause partitions: \(error)")
                }
            case .commit(let changed): commit(changed)
            case .commitTransaction(let offsets, let landed): commitTransaction(offsets, landed: landed)
            case .handOver(let handOver, let offsets, let atRisk):
                let (inbox, logger) = (self.inbox, self.logger)
                handOver(offsets) { error in
                    guard error != nil, atRisk > 0 else { return }
                    logger.warning(
                        "the broker refused the hand-over's commit: the next owner redoes \(atRisk) records finished since the last accepted commit"
                    )
                    inbox.post(.handOverCommitRefused(records: atRisk))
                }
            case .release(let count): admission.release(count)
            case .publishStatistics: recorder.publish(worker.statistics)
            case .log(let level, let message, let fields): logger.log(level, message, fields: fields)
            }
        }
    }

    private func call(_ id: Int, _ attempt: Int, _ request: PurchaseRequest, _ controller: any PurchaseController) {
        let started = clock.now
        if let answer = controller.immediateAnswer(to: request) {
            answered.append(.attemptFinished(call: id, attempt: attempt, answer, duration: clock.now - started))
            return
        }
        let inbox = self.inbox
        // Immediate: a controller whose call does not suspend after all costs no thread hop.
        let task = Task.immediate {
            let result: Result<PurchaseResult, any Error>
            do {
                result = .success(try await controller.purchase(request))
            } catch {
                result = .failure(error)
            }
            inbox.post(.attemptFinished(call: id, attempt: attempt, result, duration: ContinuousClock.now - started))
        }
        running[id] = (attempt, task)
    }

    private func commit(_ changed: [(InputPartition, KafkaTopicPartitionOffset)]) {
        let (consumer, inbox, logger) = (self.consumer, self.inbox, self.logger)
        commitTask = Task {
            do {
                try await consumer.commit(changed.map(\.1))
                inbox.post(.commitFinished(landed: Dictionary(changed, uniquingKeysWith: { $1 })))
            } catch {
                logger.warning("offset commit failed (retried at the next interval): \(error)")
                inbox.post(.commitFinished(landed: [:], failed: true))
            }
        }
    }

    private func commitTransaction(
        _ offsets: [KafkaTopicPartitionOffset], landed: [InputPartition: KafkaTopicPartitionOffset]
    ) {
        // (A worker decides transactions only when it was made with a committer.)
        guard let committer else { return }
        let inbox = self.inbox
        transactionCommit = Task { () -> KafkaError? in
            do throws(KafkaError) {
                try await committer.commit(offsets: offsets)
                inbox.post(.transactionFinished(landed: landed, error: nil))
                return nil
            } catch {
                inbox.post(.transactionFinished(landed: [:], error: error))
                return error
            }
        }
    }

    /// Encodes each output into the record buffer and hands its bytes to the producer, in order,
    /// on the worker's task: librdkafka copies them, so the buffer serves the next output at once.
    private func produce(_ outputs: consuming [(token: UInt, output: UnsentOutput)]) {
        var outputs = outputs
        var refused: [KafkaDelivery] = []
        // (Taken out of the executor for the batch: no exclusivity check per output.)
        var buffer = KafkaRecordBuffer()
        swap(&buffer, &recordBuffer)
        defer {
            // (A record larger than most, such as a large record's dead letter, is not held on to.)
            buffer.shrink()
            swap(&buffer, &recordBuffer)
        }
        // In order, each output moved out of the batch into the encoder. (A loop, not
        // `removeAllInOrder`: a closure's capture of the buffer copies it for each produce, and an
        // output destructured from the closure's argument is copied.)
        outputs.reverseMovingElements()
        while let token = outputs.last?.token {
            encoder.encode(outputs.removeLast().output, into: &buffer)
            do throws(KafkaError) {
                try producer.produce(buffer, token: token)
            } catch {
                // Reported like a failed delivery: a full local queue is tried again, anything else stops.
                let failure = KafkaError(
                    code: error.code, message: "cannot enqueue output: \(error.message)",
                    isRetriable: error.isRetriable, isFatal: error.isFatal)
                refused.append(KafkaDelivery(token: token, error: failure, record: buffer.record))
            }
        }
        if !refused.isEmpty { inbox.post(.delivered(refused)) }
    }
}

/// What the executor needs of the consumer: pausing partitions (a revocation or the drain; the
/// consumer's reader resumes what it paused for backpressure itself) and commits.
/// ``KafkaConsumer`` provides it.
protocol ConsumerControl: Sendable {
    func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError)
    func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
}

/// What the executor needs of the producer. ``KafkaProducer`` provides it; the answers reach the
/// worker's inbox as ``ProcessorInput/delivered(_:)`` batches, with the token.
protocol OutputProducer: Sendable {
    /// Produces the record in `buffer`, which is reused as soon as this returns (a producer that
    /// keeps what it is handed takes ``KafkaRecordBuffer/record``).
    func produce(_ buffer: borrowing KafkaRecordBuffer, token: UInt) throws(KafkaError)
}

/// Commits the transaction in progress with the group's offsets and begins the next one, or aborts
/// it. ``PurchaseProcessor`` provides it over its transactional producer and its consumer.
protocol TransactionCommitter: Sendable {
    func commit(offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
    /// Aborts the transaction in progress (a failed commit's too), discarding what it holds.
    func abort() async throws(KafkaError)
}

extension KafkaConsumer: ConsumerControl {}
extension KafkaProducer: OutputProducer {}
