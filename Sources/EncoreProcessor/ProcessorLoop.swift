import Dispatch
import EncoreEvents
import Kafka

/// One worker's shell around its state machines: it feeds them the inputs (records, results,
/// deliveries, the time) and carries out what they decide: calls, outputs, commits, hand-overs.
/// Created, run and ended by one task of ``PurchaseProcessor/run()``; never shared.
///
/// - ``PartitionOwnership``: assignments, generations, revocations and when they may complete.
/// - ``LaneScheduler``: one call per user at a time (the lane held until its outputs are
///   acknowledged), at most `maxInFlight` calls.
/// - ``CallTable``: attempts, backoff, timeouts, cancellation.
/// - ``OutputTracker``: outputs until acknowledged, changelog order, redelivery in order.
/// - ``OffsetTracker``: the contiguous finished prefix to commit.
final class ProcessorLoop {
    private let configuration: ProcessorConfiguration
    private let router: PurchaseRouter
    private let recorder: StatisticsRecorder
    private let consumer: any ConsumerControl
    private let producer: any OutputProducer
    private let inbox: Inbox<ProcessorInput>
    private let logger: Logger
    private let clock = ContinuousClock()
    private var random = SystemRandomNumberGenerator()

    private var ownership = PartitionOwnership<PartitionHandOver>()
    private var scheduler: LaneScheduler<WorkItem, UserLane>
    private var calls: CallTable<WorkItem>
    private var outputs = OutputTracker<WorkItem>()
    private var tracker = OffsetTracker<InputPartition>()
    private var recent: RecentRequests
    private var ledger: EntitlementLedger
    /// Counts the records held (handed out by the consumer, not yet done); released here, once per
    /// batch handled (`released` gathers them).
    private let admission: KafkaAdmission
    private var released = 0
    /// Offsets a previous owner finished beyond its commit (from the commit metadata), per partition;
    /// consumed as they arrive (`skipFinished`), kept whole in `assignedCommit`.
    private var skipFinished: [InputPartition: Set<Int64>] = [:]
    private var assignedCommit: [InputPartition: Set<Int64>] = [:]
    /// The last commit the broker accepted per partition: what the next owner would start from.
    private var landed: [InputPartition: KafkaTopicPartitionOffset] = [:]
    private var nextCommit: ContinuousClock.Instant
    /// The commit in flight, if any; one at a time.
    private(set) var commitTask: Task<Void, Never>? = nil

    /// Counters kept here and published on each tick (and when the loop ends).
    private var statistics = ProcessorStatistics()
    private let encoder: OutputEncoder
    private let outputQueue = DispatchQueue(label: "encore.processor.outputs")

    private(set) var isFinished = false
    private(set) var failure: ProcessorError? = nil

    init(
        configuration: ProcessorConfiguration, router: PurchaseRouter, recorder: StatisticsRecorder,
        consumer: any ConsumerControl, producer: any OutputProducer, inbox: Inbox<ProcessorInput>,
        admission: KafkaAdmission, logger: Logger
    ) {
        self.configuration = configuration
        self.router = router
        self.recorder = recorder
        self.consumer = consumer
        self.producer = producer
        self.inbox = inbox
        self.logger = logger
        scheduler = LaneScheduler(maxInFlight: configuration.maxInFlight)
        calls = CallTable(timeout: configuration.callTimeout, retry: configuration.retry)
        recent = RecentRequests(capacity: configuration.duplicateWindow)
        self.admission = admission
        encoder = OutputEncoder(configuration: configuration)
        ledger = EntitlementLedger(catalog: configuration.catalog)
        nextCommit = ContinuousClock.now.advanced(by: configuration.commitInterval)
    }

    /// Handles a batch of inputs; while draining, checks whether everything is done.
    func handle(_ batch: [ProcessorInput]) {
        for event in batch { handle(event) }
        flushOutputs()
        if released > 0 {
            admission.release(released)
            released = 0
        }
        if ownership.hasRevocations { pollOwnership() }
        if ownership.isDraining { checkDrained() }
    }

    private func handle(_ event: ProcessorInput) {
        switch event {
        case .records(let records):
            // Admitted by the reader of the consumer already.
            for record in records { receive(record.message, record.payload) }
        case .assigned(let partitions, let finished, let restored):
            // The ledger knows the partitions' users before any of their records is handled.
            for (partition, states) in restored {
                for state in states.values { ledger.restore(state, partition: partition) }
            }
            assign(partitions)
            for (partition, offsets) in finished where !offsets.isEmpty {
                skipFinished[partition] = offsets
                assignedCommit[partition] = offsets
            }
        case .revoked(let partitions, let handOver): revoke(partitions, handOver)
        case .commitFinished(let accepted):
            commitTask = nil
            for (partition, offset) in accepted where ownership.generations[partition] != nil {
                landed[partition] = offset
            }
        case .handOverCommitRefused(let records):
            statistics.redoneAfterHandOver += records
        case .consumerFailed(let error):
            fail(ProcessorError(.kafka, "consumer failed: \(error)"))
        case .consumerEnded:
            beginDrain()
        case .attemptFinished(let id, let attempt, let result):
            let partition = calls.calls[id]?.partition
            let action = calls.finished(
                id, attempt: attempt, result, now: clock.now, retryUnit: Double.random(in: 0..<1, using: &random),
                retryDeadline: partition.flatMap { ownership.deadline(of: $0) })
            if let action { perform(action) }
        case .delivered(let deliveries): delivered(deliveries)
        case .tick: tick()
        case .failed(let error): fail(error)
        case .shutdown:
            if !ownership.isDraining { logger.info("shutting down: draining \(calls.count) running calls") }
            beginDrain()
        }
    }

    // MARK: Intake

    private func receive(_ message: KafkaMessage, _ payload: IncomingRecord.Payload) {
        // After a revoke or during shutdown, records are left for the next owner (offsets not stored).
        // A record handed out again (around a pause and resume) is already being handled.
        guard let partition = inputPartition(message.topic, message.partition),
            let generation = ownership.generation(forNewRecordOf: partition),
            !tracker.hasReceived(partition, offset: message.offset)
        else {
            released += 1
            return
        }
        let ref = RecordRef(partition: partition, offset: message.offset, generation: generation)
        tracker.received(partition, offset: message.offset)
        statistics.received += 1
        if statistics.firstReceivedAtMs == nil { statistics.firstReceivedAtMs = currentTimeMs() }
        // (Checked for emptiness first: modifying through a missing key allocates.)
        if !skipFinished.isEmpty, skipFinished[partition]?.remove(message.offset) != nil {
            // Done before a rebalance or restart (its outputs were acknowledged): not again.
            statistics.alreadyFinished += 1
            finish(ref)
            return
        }
        switch payload {
        case .request(.success(let request)):
            let item = WorkItem(ref: ref, request: request, message: message)
            if let ready = scheduler.enqueue(item, lane: item.lane) { start(ready) }
        case .source(.success(let event)):
            // Applied in offset order, on the loop: the ledger is this loop's state.
            statistics.sourceEvents += 1
            if let update = ledger.apply(source: event, partition: message.partition, nowMs: currentTimeMs()) {
                ownership.beginWork(ref)
                outputs.publish(update, for: ref)
            } else {
                finish(ref)
            }
        case .request(.failure(let error)), .source(.failure(let error)):
            ownership.beginWork(ref)
            statistics.invalid += 1
            publishDeadLetter(
                for: message, ref: ref, item: nil, failure: DeadLetterEvent.Failure(error), attempts: 0,
                requestID: requestIDHint(message.value))
        }
    }

    /// Starts `first`; an item that ends without a call or outputs frees its slot and lane, which
    /// starts at most one other.
    private func start(_ first: WorkItem) {
        var ready: WorkItem? = first
        while let item = ready {
            ready = nil
            if recent.contains(item.requestID) {
                statistics.duplicates += 1
                finish(item.ref)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            ownership.beginWork(item.ref)
            if let deadline = item.request.deadlineAtMs, currentTimeMs() > deadline {
                let error = PurchaseOutcomeEvent.Failure(
                    type: "deadline_exceeded", message: "deadline_at_ms \(deadline) passed before the purchase started",
                    retryable: false)
                publishOutcome(item, result: .notAttempted, attempts: 0, controller: nil, error: error)
                ready = scheduler.endCall(lane: item.lane)
                continue
            }
            guard let route = router.controller(for: item.request.productID) else {
                publishOutcome(item, result: .notAttempted, attempts: 0, controller: nil, error: nil)
                ready = scheduler.endCall(lane: item.lane)
                continue
            }
            item.controllerName = route.name
            item.controller = route.controller
            perform(calls.start(item, partition: item.ref.partition, now: clock.now))
        }
        statistics.peakInFlight = max(statistics.peakInFlight, scheduler.inFlight)
    }

    // MARK: Calls

    private func perform(_ action: CallTable<WorkItem>.Action) {
        switch action {
        case .launch(let id, let item, let attempt):
            launch(id, item, attempt: attempt)
        case .cancel(let id, let item):
            logger.warning(
                "cancelling the call of request \(item.request.requestID) (call \(id)); its user's next request waits until it returns"
            )
            item.task?.cancel()
        case .settle(let item, let settlement, let attempts):
            item.task = nil
            settle(item, settlement, attempts: attempts)
        case .abandon(let item):
            // No outcome: the record stays unfinished and is read again by the next owner.
            item.task = nil
            ownership.endWork(item.ref)
            released += 1
            if let next = scheduler.finish(lane: item.lane) { start(next) }
        }
    }

    private func launch(_ id: Int, _ item: WorkItem, attempt: Int) {
        guard let controller = item.controller else { return }
        let request = PurchaseRequest(event: item.request, attempt: attempt)
        let inbox = self.inbox
        // Immediate: a controller that answers without suspending (a cache, a no-op) costs no thread hop.
        item.task = Task.immediate {
            let result: Result<PurchaseResult, any Error>
            do {
                result = .success(try await controller.purchase(request))
            } catch {
                result = .failure(error)
            }
            inbox.post(.attemptFinished(call: id, attempt: attempt, result))
        }
        statistics.controllerCalls += 1
    }

    /// The call is over: its slot is free; the lane stays held until the outputs are acknowledged.
    private func settle(_ item: WorkItem, _ settlement: CallTable<WorkItem>.Settlement, attempts: Int) {
        let next = scheduler.endCall(lane: item.lane)
        if ownership.owns(item.ref) {
            switch settlement {
            case .answered(let answer):
                publishOutcome(
                    item, result: answer.outcome, attempts: attempts, controller: item.controllerName, error: nil)
            case .failed(let error):
                publishOutcome(item, result: .failed, attempts: attempts, controller: item.controllerName, error: error)
                publishDeadLetter(
                    for: item.message, ref: item.ref, item: item,
                    failure: .init(
                        stage: .controller, errorClass: error.type, message: error.message, retryable: error.retryable),
                    attempts: attempts, requestID: item.request.requestID)
            }
        } else {
            // Only reachable when a hand-over could not wait (the loop ended): nothing is applied.
            logger.error(
                "request \(item.request.requestID) returned after its partition \(item.ref.partition) was handed over; result not applied"
            )
            released += 1
            _ = scheduler.releaseLane(item.lane).map(start)
        }
        if let next { start(next) }
    }

    // MARK: Outputs

    private func publishOutcome(
        _ item: WorkItem, result: OutcomeResult, attempts: Int, controller: String?,
        error: PurchaseOutcomeEvent.Failure?
    ) {
        let outcome = PurchaseOutcomeEvent(
            request: item.request, result: result, attempts: attempts, completedAtMs: currentTimeMs(),
            controller: controller, error: error)
        outputs.send(
            .outcome(result, requestedAtMs: item.request.requestedAtMs), .outcome(outcome), for: item.ref, item: item)
        if configuration.ledgerEnabled,
            let update = ledger.apply(
                outcome: outcome, entitlement: item.request.entitlement, campaignID: item.request.campaignID,
                offerID: item.request.offerID, partition: item.ref.partition.number)
        {
            outputs.publish(update, for: item.ref, item: item)
        }
    }

    private func publishDeadLetter(
        for message: KafkaMessage, ref: RecordRef, item: WorkItem?, failure: DeadLetterEvent.Failure, attempts: Int,
        requestID: String?
    ) {
        let letter = DeadLetterEvent(
            topic: message.topic, partition: message.partition, offset: message.offset, key: message.key,
            value: message.value, headers: message.headers.map { ($0.key, $0.value) }, error: failure,
            attempts: attempts, failedAtMs: currentTimeMs(), requestID: requestID)
        outputs.send(.deadLetter, .deadLetter(letter, key: message.key), for: ref, item: item)
    }

    /// Hands the batch's outputs to the output queue in one hop; it encodes and produces them in
    /// order, so one user's outputs keep their order. Answers come back with the token.
    private func flushOutputs() {
        guard outputs.hasUnsent else { return }
        let unsent = outputs.takeUnsent()
        let (encoder, producer, inbox) = (self.encoder, self.producer, self.inbox)
        outputQueue.async(execute: { Self.produce(unsent, encoder: encoder, producer: producer, inbox: inbox) })
    }

    private static func produce(
        _ outputs: [(token: UInt, output: UnsentOutput)], encoder: OutputEncoder, producer: any OutputProducer,
        inbox: Inbox<ProcessorInput>
    ) {
        var refused: [KafkaDelivery] = []
        for (token, output) in outputs {
            let record = encoder.record(for: output)
            do {
                try producer.produce(record, token: token)
            } catch {
                // Reported like a failed delivery: a full local queue is tried again, anything else stops.
                let failure = KafkaError(
                    code: error.code, message: "cannot enqueue output: \(error.message)",
                    isRetriable: error.isRetriable, isFatal: error.isFatal)
                refused.append(KafkaDelivery(token: token, error: failure, record: record))
            }
        }
        if !refused.isEmpty { inbox.post(.delivered(refused)) }
    }

    /// Waits until every output handed to the output queue has been given to the producer.
    func waitForOutputs() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            outputQueue.async(execute: { continuation.resume() })
        }
    }

    private func delivered(_ deliveries: [KafkaDelivery]) {
        let nowMs = currentTimeMs()
        for event in outputs.delivered(deliveries, now: clock.now) {
            switch event {
            case .acknowledged(.outcome(let result, let requestedAtMs)):
                statistics.outcomes[result, default: 0] += 1
                statistics.latency.record(UInt64(max(0, nowMs - requestedAtMs)) * 1000)
            case .acknowledged(.deadLetter):
                statistics.deadLetters += 1
            case .acknowledged(.entitlementChange):
                statistics.entitlementChanges += 1
            case .acknowledged(.entitlementState):
                break
            case .recordDone(let ref, let item):
                recordDone(ref, item)
            case .redelivering(let topic, let error):
                logger.warning("delivery to \(topic) failed (\(error)); producing again, in order")
            case .fatal(let topic, let error):
                // Committing past this record would lose its output; stop instead and let a restart redo it.
                fail(ProcessorError(.outputLost, "cannot deliver to '\(topic)': \(error)"))
            }
        }
    }

    /// Every output of the record is acknowledged: its request id counts as answered, its offset
    /// may be committed, and its user's next request may start.
    private func recordDone(_ ref: RecordRef, _ item: WorkItem?) {
        if let item, ownership.owns(ref) { recent.insert(item.requestID) }
        ownership.endWork(ref)
        finish(ref)
        if let item, let next = scheduler.releaseLane(item.lane) { start(next) }
    }

    // MARK: Offsets and partitions

    /// The record's work is complete: advance the committable offset of its partition.
    private func finish(_ ref: RecordRef) {
        statistics.finished += 1
        statistics.lastFinishedAtMs = currentTimeMs()
        released += 1
        guard ownership.owns(ref) else { return }
        _ = tracker.finished(ref.partition, offset: ref.offset)
    }

    /// The offsets to commit for `partitions`, with the finished offsets beyond them as metadata.
    func commitOffsets(for partitions: some Sequence<InputPartition>) -> [KafkaTopicPartitionOffset] {
        partitions.sorted().compactMap { partition in
            guard let position = tracker.commitPosition(partition) else { return nil }
            return KafkaTopicPartitionOffset(
                topic: topicName(partition.topic), partition: partition.number, offset: position.next,
                metadata: FinishedOffsets.encode(committed: position.next, finished: position.finishedAbove))
        }
    }

    /// Every owned partition's commit position: what shutdown commits last.
    var finalCommitOffsets: [KafkaTopicPartitionOffset] { commitOffsets(for: ownership.generations.keys) }

    private func commitIfDue(now: ContinuousClock.Instant) {
        guard now >= nextCommit, commitTask == nil else { return }
        nextCommit = now.advanced(by: configuration.commitInterval)
        // Only what changed since the last commit the broker accepted.
        let changed = ownership.assigned.sorted().compactMap { partition in
            commitOffsets(for: [partition]).first.flatMap { landed[partition] == $0 ? nil : (partition, $0) }
        }
        guard !changed.isEmpty else { return }
        let (consumer, inbox, logger) = (self.consumer, self.inbox, self.logger)
        commitTask = Task {
            do {
                try await consumer.commit(changed.map(\.1))
                inbox.post(.commitFinished(landed: Dictionary(changed, uniquingKeysWith: { $1 })))
            } catch {
                logger.warning("offset commit failed (retried at the next interval): \(error)")
                inbox.post(.commitFinished(landed: [:]))
            }
        }
    }

    /// Records of `partition` finished in this assignment that the last commit the broker accepted
    /// does not cover: what the next owner redoes if the hand-over's commit is refused.
    private func finishedBeyondLanded(_ partition: InputPartition) -> Int {
        guard let position = tracker.commitPosition(partition), let first = tracker.firstReceived(partition) else {
            return 0
        }
        let covered: (Int64) -> Bool
        if let landed = landed[partition] {
            let above = FinishedOffsets.decode(landed.metadata, committed: landed.offset)
            covered = { $0 < landed.offset || above.contains($0) }
        } else {
            // The assignment's commit: where reading started, and what it listed as finished beyond.
            let above = assignedCommit[partition] ?? []
            covered = { $0 < first || above.contains($0) }
        }
        let prefix = (first..<max(first, position.next)).reduce(0) { $0 + (covered($1) ? 0 : 1) }
        return prefix + position.finishedAbove.reduce(0) { $0 + (covered($1) ? 0 : 1) }
    }

    private func topicName(_ topic: InputPartition.Topic) -> String {
        switch topic {
        case .requests: configuration.requestsTopic
        case .sources: configuration.sourcesTopic ?? ""
        }
    }

    /// The input partition of a topic's partition; `nil` for a topic the processor does not read.
    private func inputPartition(_ topic: String, _ number: Int32) -> InputPartition? {
        if topic == configuration.requestsTopic { return .requests(number) }
        if topic == configuration.sourcesTopic { return InputPartition(topic: .sources, number: number) }
        return nil
    }

    private func pauseOrResume(_ inputs: some Collection<InputPartition>, pause: Bool) {
        let partitions = inputs.sorted().map { KafkaTopicPartition(topic: topicName($0.topic), partition: $0.number) }
        do {
            if pause { try consumer.pause(partitions) } else { try consumer.resume(partitions) }
        } catch {
            logger.warning("cannot \(pause ? "pause" : "resume") partitions: \(error)")
        }
    }

    private func assign(_ assignment: [KafkaTopicPartition]) {
        let partitions = assignment.compactMap { inputPartition($0.topic, $0.partition) }
        for partition in partitions { tracker.remove(partition) }
        ownership.assign(partitions)
        if ownership.isDraining { pauseOrResume(partitions, pause: true) }
    }

    private func revoke(_ partitions: [KafkaTopicPartition], _ handOver: @escaping PartitionHandOver) {
        let now = clock.now
        let leaving = Set(
            ownership.revoke(
                partitions.compactMap { inputPartition($0.topic, $0.partition) }, handOver: handOver, now: now,
                timeout: configuration.drainTimeout))
        // Work not started stays unprocessed: the next owner reads it again.
        let dropped = scheduler.removeWaiting { leaving.contains($0.ref.partition) }
        released += dropped.count
        if !dropped.isEmpty { logger.info("revoked: \(dropped.count) queued requests left to the next owner") }
        for action in calls.handOver(where: leaving.contains, by: now.advanced(by: configuration.drainTimeout)) {
            perform(action)
        }
    }

    /// Completes the revocations whose partitions have nothing in work; reports overdue ones and
    /// cancels their calls (then waits for them: a partition is never handed over with a call alive).
    private func pollOwnership() {
        let actions = ownership.poll(now: clock.now) { partition in
            // A periodic commit still in flight could land after the hand-over's and set offsets back;
            // ledger updates of no record (expiries) must reach the changelog before the next owner reads it.
            commitTask != nil || (partition.topic == .requests && outputs.hasUpdates(ofPartition: partition.number))
        }
        for action in actions {
            switch action {
            case .handOver(let revocation):
                handOver(revocation)
            case .overdue(let partitions, let inWork):
                logger.error(
                    "hand-over of partitions \(partitions.sorted()) is overdue: \(inWork) records still in work; cancelling their calls and waiting for them to return (the partitions are not released while a call runs)"
                )
                let leaving = Set(partitions)
                for action in calls.interrupt(where: leaving.contains) { perform(action) }
            }
        }
    }

    private func handOver(_ revocation: PartitionOwnership<PartitionHandOver>.Revocation) {
        // The consumer commits these, finished offsets included, before letting the partitions go.
        let offsets = commitOffsets(for: revocation.partitions)
        let atRisk = revocation.partitions.reduce(0) { $0 + finishedBeyondLanded($1) }
        for partition in revocation.partitions {
            tracker.remove(partition)
            skipFinished[partition] = nil
            assignedCommit[partition] = nil
            landed[partition] = nil
        }
        logger.debug(
            "revoked \(revocation.partitions.count) partitions; committing \(offsets.map { "\($0.partition)@\($0.offset)" })"
        )
        // The next owner restores these users from the changelog.
        ledger.remove(partitions: Set(revocation.partitions.filter { $0.topic == .requests }.map(\.number)))
        let (inbox, logger) = (self.inbox, self.logger)
        revocation.handOver(offsets) { error in
            guard error != nil, atRisk > 0 else { return }
            logger.warning(
                "the broker refused the hand-over's commit: the next owner redoes \(atRisk) records finished since the last accepted commit"
            )
            inbox.post(.handOverCommitRefused(records: atRisk))
        }
    }

    // MARK: Time

    private func tick() {
        // Published on the clock, not per batch: a copy of the histogram per batch costs more than the work.
        statistics.assignedPartitions = ownership.assigned.count
        recorder.publish(statistics)
        let now = clock.now
        for action in calls.tick(now: now) { perform(action) }
        outputs.tick(now: now)
        let nowMs = currentTimeMs()
        if !ownership.isDraining, let due = ledger.nextExpiryMs, due <= nowMs {
            // Users of partitions being handed over are left to the next owner, which restores them.
            for update in ledger.expire(nowMs: nowMs)
            where ownership.generation(forNewRecordOf: .requests(update.partition)) != nil {
                outputs.publish(update, for: nil)
            }
        }
        if !ownership.isDraining && !ownership.hasRevocations { commitIfDue(now: now) }
    }

    // MARK: Shutdown

    /// Stops taking records; running calls go on (bounded by their timeout) and their outputs are
    /// delivered, then the loop ends.
    private func beginDrain() {
        guard !ownership.isDraining else { return }
        let now = clock.now
        ownership.beginDrain(now: now, timeout: configuration.drainTimeout)
        pauseOrResume(ownership.generations.keys, pause: true)
        released += scheduler.removeWaiting { _ in true }.count
        for action in calls.handOver(where: { _ in true }, by: now.advanced(by: configuration.drainTimeout)) {
            perform(action)
        }
    }

    private func checkDrained() {
        guard let deadline = ownership.drainDeadline else { return }
        if calls.isEmpty && outputs.isIdle {
            end()
        } else if clock.now >= deadline {
            logger.error(
                "drain timed out with \(calls.count) calls that ignored cancellation and \(outputs.pendingRecords) records with undelivered outputs; their records are not committed and will be processed again"
            )
            end()
        }
    }

    private func end() {
        isFinished = true
        // Nothing more happens here: revocations still waiting are handed over with what finished.
        for revocation in ownership.takeRevocations() { handOver(revocation) }
        recorder.publish(statistics)
    }

    private func fail(_ error: ProcessorError) {
        logger.error("\(error)")
        if failure == nil { failure = error }
        beginDrain()
    }

    /// Cancels calls still running after the loop ended (drain timeout).
    func cancelRemainingCalls() {
        for call in calls.calls.values { call.item.task?.cancel() }
    }
}

/// The `request_id` of a record that failed validation, when one can be read, for its dead letter.
func requestIDHint(_ bytes: [UInt8]) -> String? {
    guard bytes.count <= EventLimits.recordBytes, case .object(let fields)? = try? JSONValue.parse(bytes),
        case .string(let id)? = fields["request_id"], !id.isEmpty, id.count <= EventLimits.identifierLength
    else { return nil }
    return id
}

/// What the loop needs of the consumer: flow control and commits. ``KafkaConsumer`` provides it.
protocol ConsumerControl: Sendable {
    func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError)
    func resume(_ partitions: [KafkaTopicPartition]) throws(KafkaError)
    func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
}

/// What the loop needs of the producer. ``KafkaProducer`` provides it; the answers reach the
/// loop's inbox as ``ProcessorInput/delivered(_:)`` batches, with the token.
protocol OutputProducer: Sendable {
    func produce(_ record: KafkaProducerRecord, token: UInt) throws(KafkaError)
}

extension KafkaConsumer: ConsumerControl {}
extension KafkaProducer: OutputProducer {}
