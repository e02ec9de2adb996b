import Dispatch
import EncoreEvents
import Kafka

/// One worker's state (the partitions the processor gave it) and its reaction to each input.
/// Created, run and ended by one task of ``PurchaseProcessor/run()``; never shared.
final class ProcessorLoop {
    private struct PendingRevocation {
        var partitions: Set<InputPartition>
        /// Hands the partitions over with the offsets to commit.
        var acknowledge: @Sendable ([KafkaTopicPartitionOffset]) -> Void
        var deadline: ContinuousClock.Instant
    }

    private enum Timer {
        case retry(call: Int)
        case redeliver(RecordRef?, Output, KafkaProducerRecord)
    }

    /// A ledger update whose changelog record waits for its change events: the state is written
    /// only after them, so a restored state never claims a change that was not published.
    private struct PendingUpdate {
        let ref: RecordRef?
        let state: EntitlementStateRecord
        let partition: Int32
        var unacknowledgedChanges: Int
        var isWritten = false
    }

    private let configuration: ProcessorConfiguration
    private let router: PurchaseRouter
    private let recorder: StatisticsRecorder
    private let consumer: any ConsumerControl
    private let producer: any OutputProducer
    private let inbox: Inbox<ProcessorInput>
    private let logger: Logger
    private let clock = ContinuousClock()
    private var random = SystemRandomNumberGenerator()

    private var scheduler: LaneScheduler<WorkItem, UserLane>
    private var tracker = OffsetTracker<InputPartition>()
    private var recent: RecentRequests
    /// Counts the records held (handed out by the consumer, not yet done); released here, once per
    /// batch handled (`released` gathers them).
    private let admission: KafkaAdmission
    private var released = 0
    /// Partitions of the requests topic and of the sources topic this processor owns.
    private var assigned = Set<InputPartition>()
    private var generations: [InputPartition: Int] = [:]
    /// Records being worked on (in a call, or outputs not yet acknowledged), per partition.
    private var busy: [InputPartition: Int] = [:]
    /// Outputs not yet acknowledged, per record.
    private var pendingOutputs: [RecordRef: Int] = [:]
    /// Items in a controller call (or backing off before the next attempt), by call id.
    private var calls: [Int: WorkItem] = [:]
    private var nextCallID = 0
    private var callDeadlines = FIFO<(deadline: ContinuousClock.Instant, call: Int, attempt: Int)>()
    private var timers = TimerQueue<ContinuousClock.Instant, Timer>()
    private var revocations: [PendingRevocation] = []
    private var drainDeadline: ContinuousClock.Instant? = nil
    private var ledger: EntitlementLedger
    private var pendingUpdates: [Int: PendingUpdate] = [:]
    /// Ledger updates per user in the order they happened: changelog records are written in it.
    private var updateOrder: [String: FIFO<Int>] = [:]
    private var nextUpdateID = 0

    /// Counters kept here and published on each tick (and when the loop ends).
    private var statistics = ProcessorStatistics()
    private let encoder: OutputEncoder
    private let outputQueue = DispatchQueue(label: "encore.processor.outputs")
    /// Outputs of the batch being handled, handed to the output queue together at its end.
    private var unsent: [(token: UInt, output: UnsentOutput)] = []
    /// Outputs waiting for the broker's answer, indexed by the token they were produced with.
    private var outputSlots: [OutputSlot?] = []
    private var freeSlots: [Int] = []
    /// Offsets a previous owner finished beyond its commit (from the commit metadata), per partition.
    private var finishedByPreviousOwner: [InputPartition: Set<Int64>] = [:]
    /// What was last committed per partition, to commit only what changed.
    private var lastCommitted: [InputPartition: KafkaTopicPartitionOffset] = [:]
    private var nextCommit: ContinuousClock.Instant
    /// The commit in flight, if any; one at a time.
    private(set) var commitTask: Task<Void, Never>? = nil

    private(set) var isFinished = false
    private(set) var failure: ProcessorError? = nil

    init(
        configuration: ProcessorConfiguration, router: PurchaseRouter, recorder: StatisticsRecorder,
        consumer: any ConsumerControl, producer: any OutputProducer, inbox: Inbox<ProcessorInput>,
        admission: KafkaAdmission,
        logger: Logger
    ) {
        self.configuration = configuration
        self.router = router
        self.recorder = recorder
        self.consumer = consumer
        self.producer = producer
        self.inbox = inbox
        self.logger = logger
        scheduler = LaneScheduler(maxInFlight: configuration.maxInFlight)
        recent = RecentRequests(capacity: configuration.duplicateWindow)
        self.admission = admission
        encoder = OutputEncoder(configuration: configuration)
        ledger = EntitlementLedger(catalog: configuration.catalog)
        nextCommit = ContinuousClock.now.advanced(by: configuration.commitInterval)
    }

    private var isDraining: Bool { drainDeadline != nil }

    /// Handles a batch of inputs; while draining, checks whether everything is done.
    func handle(_ batch: [ProcessorInput]) {
        for event in batch { handle(event) }
        flushOutputs()
        if released > 0 {
            admission.release(released)
            released = 0
        }
        if isDraining { checkDrained() }
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

    /// Every assigned partition's commit position: what shutdown commits last.
    var finalCommitOffsets: [KafkaTopicPartitionOffset] { commitOffsets(for: assigned) }

    private func commitIfDue(now: ContinuousClock.Instant) {
        guard now >= nextCommit, commitTask == nil else { return }
        nextCommit = now.advanced(by: configuration.commitInterval)
        // Only what changed since the last commit that was made.
        let changed = assigned.sorted().compactMap { partition in
            commitOffsets(for: [partition]).first.flatMap { lastCommitted[partition] == $0 ? nil : (partition, $0) }
        }
        guard !changed.isEmpty else { return }
        let (partitions, offsets) = (changed.map(\.0), changed.map(\.1))
        for (partition, offset) in changed { lastCommitted[partition] = offset }
        let (consumer, inbox, logger) = (self.consumer, self.inbox, self.logger)
        commitTask = Task {
            do {
                try await consumer.commit(offsets)
            } catch {
                logger.warning("offset commit failed (retried at the next interval): \(error)")
                inbox.post(.commitFailed(partitions))
            }
            inbox.post(.commitFinished)
        }
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
                finishedByPreviousOwner[partition] = offsets
            }
        case .commitFinished:
            commitTask = nil
            if !revocations.isEmpty { checkRevocations() }
        case .commitFailed(let partitions):
            for partition in partitions { lastCommitted[partition] = nil }
        case .consumer(.messages(let messages)):
            for message in messages {
                receive(
                    message,
                    IncomingRecord(message: message, isSource: message.topic == configuration.sourcesTopic).payload)
            }
        case .consumer(.partitionsAssigned(let partitions)): assign(partitions)
        case .consumer(.partitionsRevoked(let partitions, let revocation)):
            revoke(partitions) { revocation.acknowledge(committing: $0) }
        case .revoked(let partitions, let acknowledge): revoke(partitions, acknowledge)
        case .consumer(.error(let error)):
            if error.isFatal { fail(ProcessorError(.kafka, "consumer failed: \(error)")) }
        case .consumerEnded:
            if !isDraining { beginDrain() }
        case .attemptFinished(let call, let attempt, let result): attemptFinished(call, attempt, result)
        case .delivered(let deliveries): delivered(deliveries)
        case .tick: tick()
        case .failed(let error): fail(error)
        case .shutdown:
            if !isDraining {
                logger.info("shutting down: draining \(calls.count) running calls")
                beginDrain()
            }
        }
    }

    // MARK: Intake

    private func receive(_ message: KafkaMessage, _ payload: IncomingRecord.Payload) {
        // After a revoke or during shutdown, records are left for the next owner (offsets not stored).
        // A record handed out again (around a pause and resume) is already being handled.
        guard !isDraining, let partition = inputPartition(message.topic, message.partition),
            assigned.contains(partition),
            let generation = generations[partition], !tracker.hasReceived(partition, offset: message.offset)
        else {
            released += 1
            return
        }
        let ref = RecordRef(partition: partition, offset: message.offset, generation: generation)
        tracker.received(partition, offset: message.offset)
        statistics.received += 1
        if statistics.firstReceivedAtMs == nil { statistics.firstReceivedAtMs = currentTimeMs() }
        // (Checked for emptiness first: modifying through a missing key allocates.)
        if !finishedByPreviousOwner.isEmpty, finishedByPreviousOwner[partition]?.remove(message.offset) != nil {
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
                beginWork(ref)
                publish(update, for: ref)
            } else {
                finish(ref)
            }
        case .request(.failure(let error)), .source(.failure(let error)):
            beginWork(ref)
            statistics.invalid += 1
            publishDeadLetter(
                for: message, ref: ref, failure: DeadLetterEvent.Failure(error), attempts: 0,
                requestID: requestIDHint(message.value))
        }
    }

    private func start(_ first: WorkItem) {
        // An item that ends without a call frees its slot, which starts at most one other.
        var ready: WorkItem? = first
        while let item = ready {
            ready = nil
            if recent.contains(item.requestID) {
                statistics.duplicates += 1
                finish(item.ref)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            beginWork(item.ref)
            let now = currentTimeMs()
            if let deadline = item.request.deadlineAtMs, now > deadline {
                let error = PurchaseOutcomeEvent.Failure(
                    type: "deadline_exceeded", message: "deadline_at_ms \(deadline) passed before the purchase started",
                    retryable: false)
                publishOutcome(item, result: .notAttempted, attempts: 0, controller: nil, error: error)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            guard let route = router.controller(for: item.request.productID) else {
                publishOutcome(item, result: .notAttempted, attempts: 0, controller: nil, error: nil)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            let id = nextCallID
            nextCallID += 1
            item.controllerName = route.name
            item.controller = route.controller
            calls[id] = item
            launch(id)
        }
        statistics.peakInFlight = max(statistics.peakInFlight, scheduler.inFlight)
    }

    private func launch(_ id: Int) {
        guard let call = calls[id], let controller = call.controller else { return }
        let request = PurchaseRequest(event: call.request, attempt: call.attempt)
        let attempt = call.attempt
        let inbox = self.inbox
        // Immediate: a controller that answers without suspending (a cache, a no-op) costs no thread hop.
        call.task = Task.immediate {
            let result: Result<PurchaseResult, any Error>
            do {
                result = .success(try await controller.purchase(request))
            } catch {
                result = .failure(error)
            }
            inbox.post(.attemptFinished(call: id, attempt: attempt, result))
        }
        call.isBackingOff = false
        callDeadlines.append((clock.now.advanced(by: configuration.callTimeout), id, attempt))
        statistics.controllerCalls += 1
    }

    // MARK: Controller results

    private func attemptFinished(_ id: Int, _ attempt: Int, _ result: Result<PurchaseResult, any Error>) {
        // A call that timed out or was interrupted has already been settled.
        guard let call = calls[id], call.attempt == attempt, !call.isBackingOff else { return }
        switch result {
        case .success(let answer):
            settle(id, result: answer.outcome, error: nil)
        case .failure(let error as PurchaseControllerError):
            let backoff = configuration.retry.backoff(after: attempt, unit: Double.random(in: 0..<1, using: &random))
            let due = clock.now.advanced(by: backoff)
            // While draining, a retry is still made if it can finish in time; otherwise the
            // record is left unanswered and redone by the next owner (retrying is safe).
            let fitsDrain = drainDeadline.map { due < $0 } ?? true
            if error.isRetryable, configuration.retry.allowsRetry(after: attempt), fitsDrain {
                call.isBackingOff = true
                call.task = nil
                timers.schedule(.retry(call: id), at: due)
            } else if error.isRetryable && configuration.retry.allowsRetry(after: attempt) {
                interrupt(id)
            } else {
                settle(
                    id, result: .failed,
                    error: .init(type: error.type, message: error.message, retryable: error.isRetryable))
            }
        case .failure(let error):
            if error is CancellationError && isDraining {
                interrupt(id)
            } else {
                let type = String(describing: Swift.type(of: error))
                settle(id, result: .failed, error: .init(type: type, message: "\(error)", retryable: false))
            }
        }
    }

    /// Ends a call with an outcome and frees its lane.
    private func settle(_ id: Int, result: OutcomeResult, error: PurchaseOutcomeEvent.Failure?) {
        guard let call = calls.removeValue(forKey: id) else { return }
        publishOutcome(call, result: result, attempts: call.attempt, controller: call.controllerName, error: error)
        if result == .failed, let error {
            publishDeadLetter(
                for: call.message, ref: call.ref,
                failure: .init(
                    stage: .controller, errorClass: error.type, message: error.message, retryable: error.retryable),
                attempts: call.attempt, requestID: call.request.requestID)
        }
        release(call)
    }

    /// Ends a call without an outcome (shutdown or revoke): the record is read again by the next owner.
    private func interrupt(_ id: Int) {
        guard let call = calls.removeValue(forKey: id) else { return }
        call.task?.cancel()
        endWork(call.ref)
        released += 1
        release(call)
    }

    /// Frees the item's lane and starts what may start now. While draining nothing is waiting
    /// (the queues were emptied and intake stopped), so nothing new starts.
    private func release(_ item: WorkItem) {
        if let next = scheduler.finish(lane: item.lane) { start(next) }
    }

    // MARK: Outputs

    private func publishOutcome(
        _ item: WorkItem, result: OutcomeResult, attempts: Int, controller: String?,
        error: PurchaseOutcomeEvent.Failure?
    ) {
        let outcome = PurchaseOutcomeEvent(
            request: item.request, result: result, attempts: attempts, completedAtMs: currentTimeMs(),
            controller: controller, error: error)
        recent.insert(item.requestID)
        send(for: item.ref, output: .outcome(result, requestedAtMs: item.request.requestedAtMs), .outcome(outcome))
        if configuration.ledgerEnabled,
            let update = ledger.apply(
                outcome: outcome, entitlement: item.request.entitlement, campaignID: item.request.campaignID,
                offerID: item.request.offerID, partition: item.ref.partition.number)
        {
            publish(update, for: item.ref)
        }
    }

    /// Publishes a ledger update: its change events now, its changelog record once they and the
    /// user's earlier updates are acknowledged. The record (if any) finishes after both.
    private func publish(_ update: LedgerUpdate, for ref: RecordRef?) {
        let id = nextUpdateID
        nextUpdateID += 1
        pendingUpdates[id] = PendingUpdate(
            ref: ref, state: update.state, partition: update.partition, unacknowledgedChanges: update.changes.count)
        updateOrder[update.state.key, default: FIFO()].append(id)
        // The changelog record is counted now, so the record cannot finish before it is written.
        if let ref { pendingOutputs[ref, default: 0] += 1 }
        for change in update.changes {
            send(for: ref, output: .entitlementChange(update: id), .change(change))
        }
        writeStateIfReady(ofUser: update.state.key)
    }

    /// Writes the user's oldest unwritten changelog record when its change events are acknowledged.
    private func writeStateIfReady(ofUser key: String) {
        guard let id = updateOrder[key]?.first, let update = pendingUpdates[id], update.unacknowledgedChanges == 0,
            !update.isWritten
        else { return }
        pendingUpdates[id]?.isWritten = true
        send(
            for: update.ref, output: .entitlementState(update: id), counted: false,
            .state(update.state, partition: update.partition))
    }

    private func publishDeadLetter(
        for message: KafkaMessage, ref: RecordRef, failure: DeadLetterEvent.Failure, attempts: Int, requestID: String?
    ) {
        let letter = DeadLetterEvent(
            topic: message.topic, partition: message.partition, offset: message.offset, key: message.key,
            value: message.value, headers: message.headers.map { ($0.key, $0.value) }, error: failure,
            attempts: attempts, failedAtMs: currentTimeMs(), requestID: requestID)
        send(for: ref, output: .deadLetter, .deadLetter(letter, key: message.key))
    }

    /// Queues an output for the output queue, which encodes and produces in the order outputs are
    /// sent, so one user's outcomes keep their order; the broker's answer comes back through the
    /// inbox with the output's token.
    private func send(for ref: RecordRef?, output: Output, counted: Bool = true, _ unsentOutput: UnsentOutput) {
        if counted, let ref { pendingOutputs[ref, default: 0] += 1 }
        let slot = OutputSlot(ref: ref, output: output)
        let token: Int
        if let free = freeSlots.popLast() {
            token = free
            outputSlots[token] = slot
        } else {
            token = outputSlots.count
            outputSlots.append(slot)
        }
        unsent.append((UInt(token), unsentOutput))
    }

    /// One hop to the output queue per batch rather than one per record; order is kept.
    private func flushOutputs() {
        guard !unsent.isEmpty else { return }
        let outputs = unsent
        unsent.removeAll(keepingCapacity: true)
        let (encoder, producer, inbox) = (self.encoder, self.producer, self.inbox)
        outputQueue.async(execute: { Self.produce(outputs, encoder: encoder, producer: producer, inbox: inbox) })
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
                    isRetriable: error.isRetriable || error.code == .queueFull, isFatal: error.isFatal)
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
        for delivery in deliveries {
            let token = Int(delivery.token)
            guard token < outputSlots.count, let slot = outputSlots[token] else { continue }
            outputSlots[token] = nil
            freeSlots.append(token)
            if let error = delivery.error {
                deliveryFailed(slot, error, delivery.record)
            } else {
                acknowledged(slot, nowMs: nowMs)
            }
        }
    }

    private func deliveryFailed(_ slot: OutputSlot, _ error: KafkaError, _ record: KafkaProducerRecord?) {
        let topic = record?.topic ?? "?"
        if error.isRetriable && !error.isFatal, let record {
            logger.warning("delivery to \(topic) failed (\(error)); producing again")
            timers.schedule(.redeliver(slot.ref, slot.output, record), at: clock.now.advanced(by: .milliseconds(500)))
        } else {
            // Committing past this record would lose its output; stop instead and let a restart redo it.
            fail(ProcessorError(.outputLost, "cannot deliver to '\(topic)': \(error)"))
        }
    }

    private func acknowledged(_ slot: OutputSlot, nowMs: Int64) {
        switch slot.output {
        case .outcome(let result, let requestedAtMs):
            statistics.outcomes[result, default: 0] += 1
            statistics.latency.record(UInt64(max(0, nowMs - requestedAtMs)) * 1000)
        case .deadLetter:
            statistics.deadLetters += 1
        case .entitlementChange(let id):
            statistics.entitlementChanges += 1
            if let update = pendingUpdates[id] {
                pendingUpdates[id]?.unacknowledgedChanges -= 1
                writeStateIfReady(ofUser: update.state.key)
            }
        case .entitlementState(let id):
            if let update = pendingUpdates.removeValue(forKey: id) {
                let key = update.state.key
                _ = updateOrder[key]?.popFirst()
                if updateOrder[key]?.isEmpty ?? false { updateOrder[key] = nil }
                writeStateIfReady(ofUser: key)
            }
        }
        guard let ref = slot.ref else { return }
        let remaining = (pendingOutputs[ref] ?? 1) - 1
        if remaining > 0 {
            pendingOutputs[ref] = remaining
        } else {
            pendingOutputs[ref] = nil
            endWork(ref)
            finish(ref)
        }
    }

    // MARK: Offsets and partitions

    private func beginWork(_ ref: RecordRef) {
        busy[ref.partition, default: 0] += 1
    }

    private func endWork(_ ref: RecordRef) {
        let count = (busy[ref.partition] ?? 1) - 1
        busy[ref.partition] = count > 0 ? count : nil
        if !revocations.isEmpty { checkRevocations() }
    }

    /// The record's work is complete: advance the committable offset of its partition.
    private func finish(_ ref: RecordRef) {
        statistics.finished += 1
        statistics.lastFinishedAtMs = currentTimeMs()
        released += 1
        guard generations[ref.partition] == ref.generation,
            assigned.contains(ref.partition) || isRevoking(ref.partition)
        else { return }
        _ = tracker.finished(ref.partition, offset: ref.offset)
    }

    private func isRevoking(_ partition: InputPartition) -> Bool {
        revocations.contains { $0.partitions.contains(partition) }
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
        for partition in partitions {
            assigned.insert(partition)
            generations[partition, default: 0] += 1
            tracker.remove(partition)
        }
        if isDraining { pauseOrResume(partitions, pause: true) }
    }

    private func revoke(
        _ partitions: [KafkaTopicPartition], _ acknowledge: @escaping @Sendable ([KafkaTopicPartitionOffset]) -> Void
    ) {
        let revoked = Set(partitions.compactMap { inputPartition($0.topic, $0.partition) })
        assigned.subtract(revoked)
        // Work not started stays unprocessed: the next owner reads it again.
        let dropped = scheduler.removeWaiting { revoked.contains($0.ref.partition) }
        admission.release(dropped.count)
        if !dropped.isEmpty { logger.info("revoked: \(dropped.count) queued requests left to the next owner") }
        revocations.append(
            PendingRevocation(
                partitions: revoked, acknowledge: acknowledge,
                deadline: clock.now.advanced(by: configuration.drainTimeout)))
        checkRevocations()
    }

    private func checkRevocations() {
        let now = clock.now
        revocations.removeAll { pending in
            // A periodic commit still in flight could land after this one and set the offsets back.
            // Ledger updates of no record (expiries) must reach the changelog before the next owner reads it.
            let idle =
                pending.partitions.allSatisfy { busy[$0] == nil } && commitTask == nil
                && !pendingUpdates.values.contains { pending.partitions.contains(.requests($0.partition)) }
            guard idle || now >= pending.deadline else { return false }
            if !idle { logger.warning("revocation drain timed out; releasing partitions with work still running") }
            // The consumer commits these, finished offsets included, before letting the partitions go.
            let offsets = commitOffsets(for: pending.partitions)
            for partition in pending.partitions {
                tracker.remove(partition)
                generations[partition, default: 0] += 1
                finishedByPreviousOwner[partition] = nil
                lastCommitted[partition] = nil
            }
            logger.debug(
                "revoked \(pending.partitions.count) partitions; committing \(offsets.map { "\($0.partition)@\($0.offset)+\(FinishedOffsets.decode($0.metadata, committed: $0.offset).count)" })"
            )
            // The next owner restores these users from the changelog.
            ledger.remove(partitions: Set(pending.partitions.filter { $0.topic == .requests }.map(\.number)))
            pending.acknowledge(offsets)
            return true
        }
    }

    // MARK: Time

    private func tick() {
        // Published on the clock, not per batch: a copy of the histogram per batch costs more than the work.
        statistics.assignedPartitions = assigned.count
        recorder.publish(statistics)
        let now = clock.now
        // Entries of calls that already ended are dropped as they reach the front, so the queue
        // holds about the calls in flight rather than every call of the last timeout period.
        while let first = callDeadlines.first,
            first.deadline <= now || calls[first.call].map({ $0.attempt != first.attempt || $0.isBackingOff }) ?? true
        {
            _ = callDeadlines.popFirst()
            guard first.deadline <= now, let call = calls[first.call], call.attempt == first.attempt, !call.isBackingOff
            else { continue }
            call.task?.cancel()
            settle(
                first.call, result: .failed,
                error: .init(
                    type: "timeout", message: "the controller did not answer within \(configuration.callTimeout)",
                    retryable: false))
        }
        for timer in timers.popDue(now: now) {
            switch timer {
            case .retry(let id):
                guard let call = calls[id], call.isBackingOff else { continue }
                call.attempt += 1
                launch(id)
            case .redeliver(let ref, let output, let record):
                send(for: ref, output: output, counted: false, .record(record))
            }
        }
        let nowMs = currentTimeMs()
        if !isDraining, let due = ledger.nextExpiryMs, due <= nowMs {
            // Users of partitions being handed over are left to the next owner, which restores them.
            for update in ledger.expire(nowMs: nowMs) where assigned.contains(.requests(update.partition)) {
                publish(update, for: nil)
            }
        }
        if !revocations.isEmpty { checkRevocations() }
        if !isDraining && revocations.isEmpty { commitIfDue(now: now) }
    }

    // MARK: Shutdown

    private func beginDrain() {
        drainDeadline = clock.now.advanced(by: configuration.drainTimeout)
        pauseOrResume(assigned, pause: true)
        admission.release(scheduler.removeWaiting { _ in true }.count)
    }

    private func checkDrained() {
        guard let deadline = drainDeadline else { return }
        if calls.isEmpty && pendingOutputs.isEmpty && pendingUpdates.isEmpty {
            isFinished = true
            recorder.publish(statistics)
        } else if clock.now >= deadline {
            recorder.publish(statistics)
            logger.warning(
                "drain timed out with \(calls.count) calls running, \(pendingOutputs.count) records and \(pendingUpdates.count) ledger updates undelivered; they will be processed again"
            )
            isFinished = true
        }
    }

    private func fail(_ error: ProcessorError) {
        logger.error("\(error)")
        if failure == nil { failure = error }
        if !isDraining { beginDrain() }
    }

    /// Cancels calls still running after the loop ended (drain timeout).
    func cancelRemainingCalls() {
        for call in calls.values { call.task?.cancel() }
        calls.removeAll()
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
