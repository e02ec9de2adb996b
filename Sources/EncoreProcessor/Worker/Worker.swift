import EncoreEvents
import Kafka

/// One worker's decisions, as one state machine: every input (records, deliveries, call results,
/// ticks, assignments, revocations, commit and transaction results) comes in with the time, and
/// what is to be done goes out as ``WorkerAction``s (calls, outputs, commits, pauses, hand-overs,
/// log lines) for its ``WorkerExecutor`` to carry out. It performs no effect, reads no clock and
/// shares nothing: its executor owns it, on one task.
///
/// It composes smaller machines, each deciding one thing:
/// - ``PartitionOwnership``: assignments, generations, revocations and when they may complete.
/// - ``LaneScheduler``: one request per user at a time (the lane held until its outputs are
///   acknowledged).
/// - ``CallTable``: attempts, backoff, timeouts, cancellation, reconciliation, the call bound.
/// - ``OutputTracker``: outputs until acknowledged, changelog order, redelivery in order.
/// - ``OffsetTracker``: the contiguous finished prefix to commit.
/// - ``TransactionProtocol``: exactly-once's transactions.
/// - ``EntitlementLedger`` and its ``RequestMemory``: users' state and the request journal.
struct Worker {
    let configuration: ProcessorConfiguration
    let router: PurchaseRouter
    /// Jitter for retry backoff: a cheap generator (one draw per controller result).
    var random: SplitMix64
    /// The time of the input being handled: the monotonic clock and the wall clock (ms).
    var now: ContinuousClock.Instant
    var nowMs: Int64
    /// What the input decided, in order; taken by the executor (``takeActions()``).
    private(set) var actions: [WorkerAction] = []
    /// Debug lines are decided only when they would be logged.
    let logsDebug: Bool

    var ownership: PartitionOwnership<PartitionHandOver>
    var scheduler: LaneScheduler<WorkItem, UserLane>
    var calls: CallTable<WorkItem>
    /// Items whose intent is durable, waiting for a call slot (``CallTable/hasFreeSlot``).
    var waitingForSlot = FIFO<WorkItem>()
    /// New requests whose intent waits for a place ahead of the calls (``intentWindow``).
    var waitingForIntent = FIFO<WorkItem>()
    /// First intents out whose calls are not in the call table yet (journaling, acknowledged and
    /// waiting for a slot, or held in a transaction).
    var intentsAhead = 0
    /// How many first intents may be out ahead of the calls: eight times the call bound. Each is an
    /// open intent, which holds its user at a takeover until its call could be over (the call
    /// timeout and the skew margin, 35 s by default) whether or not the call was made: journaled
    /// for every user in the buffer, a crash held them all (measured on Tansu: a restart answered
    /// 36 requests, then none for 22 s). Eight bounds ahead keep calls fed while intents make their
    /// round trip: on Tansu, 300,000 requests at 0 ms, three bounds ran at 19,195 and 20,496/s,
    /// eight at 25,372 and 26,709/s, and no bound at 27,090 and 23,504/s, interleaved.
    var intentWindow: Int { 8 * calls.limit }
    var outputs = OutputTracker<WorkItem>()
    var tracker = OffsetTracker<InputPartition>()
    /// The users' state: grants and the request journal (intents and results).
    var ledger: EntitlementLedger
    /// Records done with (handed out by the consumer and admitted), released once per batch.
    var released = 0
    /// Offsets a previous owner finished beyond its commit (from the commit metadata), per partition;
    /// consumed as they arrive (`skipFinished`), kept whole in `assignedCommit`.
    var skipFinished: [InputPartition: Set<Int64>] = [:]
    var assignedCommit: [InputPartition: Set<Int64>] = [:]
    /// The last commit the broker accepted per partition: what the next owner would start from.
    var landed: [InputPartition: KafkaTopicPartitionOffset] = [:]
    /// The commit each owned partition was assigned with: exactly-once, what a transaction sends for
    /// a partition with no record read yet, so that every transaction carries the group's
    /// generation for the broker to check (a transaction without offsets would fence no zombie).
    var assignedWith: [InputPartition: KafkaTopicPartitionOffset] = [:]
    var nextCommit: ContinuousClock.Instant
    /// When the request journal next forgets what is past the dedupe retention.
    var nextJournalPrune: ContinuousClock.Instant
    /// A periodic commit is in flight (one at a time).
    var commitInFlight = false
    /// When the drain's overdue calls were last reported.
    var drainReportedAt: ContinuousClock.Instant? = nil
    /// Exactly-once mode: the transaction in progress; `nil` otherwise.
    var transactions: TransactionProtocol<WorkItem, TransactionHandOver>? = nil
    /// Exactly-once: a transaction's commit is in flight.
    var transactionCommitInFlight = false

    /// Counters kept here and published on each tick (and when the loop ends).
    var statistics = ProcessorStatistics()
    /// Requests gone in doubt since the last tick (logged once per tick).
    var newlyInDoubt = 0
    /// Dead-letter warnings: at most ten a second.
    var warnings = WarningRateLimit(perSecond: 10)

    private(set) var isFinished = false
    private(set) var failure: ProcessorError? = nil

    /// `transactional`: exactly-once, every output and offset in transactions.
    init(
        configuration: ProcessorConfiguration, router: PurchaseRouter, transactional: Bool,
        now: ContinuousClock.Instant, nowMs: Int64, seed: UInt64, logsDebug: Bool,
        userSource: (any UserStateSource)? = nil
    ) {
        if transactional {
            transactions = TransactionProtocol()
            // In a transaction every changelog record is written as soon as it is ready, as before
            // records were shared (nothing measured calls for more there).
            outputs = OutputTracker(sharesRecords: false)
        }
        self.configuration = configuration
        self.router = router
        self.now = now
        self.nowMs = nowMs
        self.logsDebug = logsDebug
        random = SplitMix64(seed: seed)
        // Lanes keep one request per user running; the records held (`--buffer-size`, admitted by
        // the consumer's reader) bound how many. The call table owns the call bound
        // (`maxInFlight`), so a request waiting for its intent holds no call slot.
        scheduler = LaneScheduler(maxInFlight: configuration.bufferCapacity)
        calls = CallTable(
            timeout: configuration.callTimeout, retry: configuration.retry, reconcile: configuration.reconciliation,
            limit: configuration.maxInFlight)
        ownership = PartitionOwnership(
            reportInterval: configuration.drainTimeout, stuckAfter: configuration.stuckCallLimit)
        ledger = EntitlementLedger(catalog: configuration.catalog, journal: configuration.journal)
        ledger.nowMs = nowMs
        if let userSource, let limit = configuration.residentUsers {
            // (The limit is the instance's: each worker keeps its share.)
            ledger.keepResident(atMost: max(1, limit / max(1, configuration.workers)), source: userSource)
        }
        nextCommit = now.advanced(by: configuration.commitInterval)
        nextJournalPrune = now.advanced(by: .seconds(60))
    }

    // MARK: Inputs

    /// Handles one input at `now`; its decisions wait in ``actions``.
    mutating func handle(_ input: consuming ProcessorInput, now: ContinuousClock.Instant, nowMs: Int64) {
        (self.now, self.nowMs) = (now, nowMs)
        ledger.nowMs = nowMs
        handle(input)
    }

    /// What a batch of inputs decides once they are all handled: its outputs go out in one hand-off,
    /// the records it is done with are released, revocations and the drain are checked (and what
    /// those produced goes out after).
    mutating func endBatch(now: ContinuousClock.Instant, nowMs: Int64) {
        (self.now, self.nowMs) = (now, nowMs)
        flushOutputs()
        if released > 0 {
            emit(.release(released))
            released = 0
        }
        if ownership.hasRevocations { pollOwnership() }
        if ownership.isDraining { checkDrained() }
        // A hand-over or drain above may have produced outputs.
        flushOutputs()
    }

    /// The actions decided since the last take, in order.
    mutating func takeActions(into buffer: inout [WorkerAction]) {
        buffer.removeAll(keepingCapacity: true)
        swap(&buffer, &actions)
    }

    mutating func emit(_ action: consuming WorkerAction) { actions.append(action) }

    /// A log line; a debug line only when debug lines are logged (decide at the call site
    /// whether to build it: `if logsDebug`).
    mutating func log(_ level: Logger.Level, _ message: String, fields: [(String, String)] = []) {
        guard level > .debug || logsDebug else { return }
        emit(.log(level, message, fields: fields))
    }

    /// Hands the batch's outputs to the executor in one action, in order, so one user's outputs
    /// keep their order; their answers come back with the token.
    mutating func flushOutputs() {
        guard outputs.hasUnsent else { return }
        // While a transaction commits, outputs wait for the next one.
        if let state = transactions, !state.acceptsOutputs { return }
        let unsent = outputs.takeUnsent()
        // (Changelog records that turned out not to be ready yet: nothing to produce.)
        guard !unsent.isEmpty else { return }
        transactions?.handed(unsent.count)
        emit(.produce(unsent))
    }

    mutating func handle(_ event: consuming ProcessorInput) {
        switch consume event {
        case .records(var records):
            // Admitted by the reader of the consumer already. Each record is moved on into its work item.
            records.removeAllInOrder { receive($0) }
        case .assigned(let partitions, let finished, let restored, let committed):
            // The ledger knows the partitions' users before any of their records is handled. A
            // partition still owned keeps what the loop knows: newer than what was read.
            // The journal's records first: an earlier version's journal in a state record is older.
            for (partition, restored) in restored where ownership.generations[.requests(partition)] == nil {
                ledger.restore(journal: restored.journal, partition: partition)
                for state in restored.states.values { ledger.restore(state, partition: partition, nowMs: nowMs) }
                // (With users read from the store when needed, the restore read only those with an open request.)
                ledger.markResident(restored.users, partition: partition)
            }
            for update in ledger.takeLegacyCleanups() { outputs.publish(update, for: nil) }
            assign(partitions)
            assignedWith.merge(committed) { _, new in new }
            for (partition, offsets) in finished where !offsets.isEmpty {
                skipFinished[partition] = offsets
                assignedCommit[partition] = offsets
            }
        case .revoked(let partitions, let handOver): revoke(partitions, handOver)
        case .commitFinished(let accepted, let failed):
            if failed { statistics.commitFailures += 1 }
            commitInFlight = false
            for (partition, offset) in accepted where ownership.generations[partition] != nil {
                landed[partition] = offset
            }
        case .handOverCommitRefused(let records):
            statistics.redoneAfterHandOver += records
        case .transactionFinished(let landed, let error):
            transactionFinished(landed: landed, error: error)
        case .consumerFailed(let error):
            fail(ProcessorError(.kafka, "consumer failed: \(error)"))
        case .consumerEnded:
            beginDrain()
        case .attemptFinished(let id, let attempt, let result, let duration):
            statistics.callDuration.record(duration.wholeMicroseconds)
            if case .failure(let error) = result { statistics.controllerErrors[Self.errorType(error), default: 0] += 1 }
            let action: CallTable<WorkItem>.Action?
            do {
                // (A copy, ended before `perform` changes the ownership: the closure may not read self.)
                let ownership = self.ownership
                action = calls.finished(
                    id, attempt: attempt, result, now: now, retryUnit: random.nextUnit(),
                    retryDeadline: { ownership.deadline(of: $0) })
            }
            if let action { perform(action) }
            // An ask of a request in doubt that returned unanswered gives its slot back and decides
            // nothing: the calls waiting for a slot start.
            startWaitingCalls()
        case .delivered(let deliveries): delivered(deliveries)
        case .tick: tick()
        case .failed(let error): fail(error)
        case .shutdown:
            if !ownership.isDraining { log(.info, "shutting down: draining \(calls.count) running calls") }
            beginDrain()
        }
    }

    // MARK: Intake

    mutating func receive(_ record: consuming IncomingRecord) {
        switch consume record {
        case .request(let message, let request):
            guard let ref = admit(message) else { return }
            switch consume request {
            case .success(let request):
                // (The user's lane as the journal keeps it: later lookups compare its key by identity.)
                let lane = ledger.lane(appID: request.appID, appUserID: request.appUserID, partition: message.partition)
                let item = WorkItem(ref: ref, request: request, message: message, receivedAt: now, lane: lane)
                if let ready = scheduler.enqueue(item, lane: item.lane) { start(ready) }
            case .failure(let error): reject(message, ref, error)
            }
        case .source(let message, let event):
            guard let ref = admit(message) else { return }
            switch consume event {
            case .success(let event):
                // Applied in offset order, on the loop: the ledger is this loop's state.
                statistics.sourceEvents += 1
                if let update = ledger.apply(source: event, partition: message.partition, nowMs: nowMs) {
                    ownership.beginWork(ref)
                    outputs.publish(update, for: ref, trace: TraceContext(message.headerBuffer).headers)
                } else {
                    finish(ref)
                }
            case .failure(let error): reject(message, ref, error)
            }
        }
    }

    /// A record that did not decode: its dead letter.
    private mutating func reject(_ message: KafkaMessage, _ ref: RecordRef, _ error: EventValidationError) {
        ownership.beginWork(ref)
        statistics.invalid += 1
        publishDeadLetter(
            for: message, ref: ref, failure: DeadLetterEvent.Failure(error),
            requestID: PurchaseRequestEvent.requestIDHint(message.value)
        )
    }

    /// The record's reference, when it is to be handled (nil: it is not, and it is released).
    private mutating func admit(_ message: borrowing KafkaMessage) -> RecordRef? {
        // After a revoke or during shutdown, records are left for the next owner (offsets not stored).
        // A record handed out again (around a pause and resume) is already being handled.
        // (Not through a method of `self`: that copied the whole worker here.)
        guard let partition = InputPartition.of(message.topic, message.partition, in: configuration),
            let generation = ownership.generation(forNewRecordOf: partition),
            !tracker.hasReceived(partition, offset: message.offset)
        else {
            released += 1
            return nil
        }
        let ref = RecordRef(partition: partition, offset: message.offset, generation: generation)
        tracker.received(partition, offset: message.offset)
        statistics.received += 1
        if statistics.firstReceivedAtMs == nil { statistics.firstReceivedAtMs = nowMs }
        // (Checked for emptiness first: modifying through a missing key allocates.)
        if !skipFinished.isEmpty, skipFinished[partition]?.remove(message.offset) != nil {
            // Done before a rebalance or restart (its outputs were acknowledged): not again.
            statistics.alreadyFinished += 1
            finish(ref)
            return nil
        }
        return ref
    }

    // MARK: Calls

    mutating func perform(_ action: CallTable<WorkItem>.Action) {
        switch action {
        case .launch(let id, let item, let attempt):
            launch(id, item, attempt: attempt)
        case .wait:
            break
        case .journal(let id, let item, let attempt):
            // The attempt launches once its intent is durable (``intentDurable(_:)``): a next
            // owner holds the user's lane until the call could no longer be running.
            item.journalingCall = (id, attempt)
            outputs.publish(
                ledger.recordIntent(
                    item.request, attempt: attempt, partition: item.ref.partition.number, nowMs: nowMs,
                    offset: item.ref.offset, digest: item.digest, known: item.identity, holdsState: false),
                for: nil, intent: item)
        case .doubt(let item, let failure, let attempts):
            doubt(item, failure, attempts: attempts)
            startWaitingCalls()
        case .cancel(let id, _):
            // Logged by the caller, once per batch of cancellations.
            emit(.cancelCall(id))
        case .settle(let item, let settlement, let attempts):
            settle(item, settlement, attempts: attempts)
            startWaitingCalls()
        case .abandon(let item):
            // No outcome: the record stays unfinished and is read again by the next owner.
            leaveIntentWindow(item)
            ownership.endWork(item.ref)
            released += 1
            if let next = scheduler.finish(lane: item.lane) { start(next) }
            startWaitingCalls()
        }
    }

    mutating func launch(_ id: Int, _ item: WorkItem, attempt: Int) {
        guard let controller = item.controller else { return }
        let request = PurchaseRequest(
            event: item.request, attempt: attempt, traceparent: item.trace.parent, tracestate: item.trace.state)
        if request.isRecovery { statistics.recoveryCalls += 1 }
        if item.inDoubtSinceMs != nil { statistics.reconcileCalls += 1 }
        statistics.controllerCalls += 1
        if attempt > item.firstAttempt { statistics.retries += 1 }
        emit(.call(id, attempt: attempt, consume request, controller))
    }

    /// How a failed call counts in `encore_controller_errors_total`: the controller's error type.
    static func errorType(_ error: any Error) -> String {
        switch error {
        case let error as PurchaseControllerError: error.type
        case let error as PurchaseNotAttempted: error.type
        case is CancellationError: "cancelled"
        default: String(describing: type(of: error))
        }
    }

    /// The call is over: its slot is free; the lane stays held until the outputs are acknowledged.
    mutating func settle(_ item: WorkItem, _ settlement: CallTable<WorkItem>.Settlement, attempts: Int) {
        let next = scheduler.endCall(lane: item.lane)
        if ownership.owns(item.ref) {
            // (A replay's controller only: the request is built for it alone, and the cast is
            // tried only when one is registered.)
            let replaying = router.hasReplayingController ? item.controller as? any ReplayingController : nil
            let replayed = replaying.flatMap {
                $0.recordedCompletion(of: PurchaseRequest(event: item.request, attempt: attempts))
            }
            switch settlement {
            case .answered(let answer):
                publishOutcome(
                    item, result: answer.outcome, attempts: attempts, controller: item.controllerName, error: nil,
                    completedAtMs: replayed)
            case .failed(let error):
                journalFailure(item, error, attempts: attempts)
            case .notAttempted(let reason):
                publishOutcome(
                    item, result: .notAttempted, attempts: attempts, controller: item.controllerName, error: reason,
                    completedAtMs: replayed)
            case .expired(let failure):
                expire(item, failure, attempts: attempts)
            }
            if item.inDoubtSinceMs != nil, !settlement.isExpiry {
                // Billing answered: the request's one final outcome follows its `pending`.
                statistics.inDoubtResolved += 1
            }
        } else {
            // Only reachable when a hand-over could not wait (the loop ended): nothing is applied.
            log(
                .error,
                "request \(item.request.requestID) returned after its partition \(item.ref.partition) was handed over; result not applied"
            )
            released += 1
            if let next = scheduler.releaseLane(item.lane) { start(next) }
        }
        if let next { start(next) }
    }

    // MARK: Outputs

    /// Publishes the request's outcome (and dead letter, when it failed) with the ledger update
    /// recording its result and grants; the changelog record follows once they are acknowledged.
    mutating func publishOutcome(
        _ item: WorkItem, result: OutcomeResult, attempts: Int, controller: String?,
        error: PurchaseOutcomeEvent.Failure?, deadLetter: DeadLetterEvent.Failure? = nil, completedAtMs: Int64? = nil
    ) {
        let outcome = PurchaseOutcomeEvent(
            request: item.request, result: result, attempts: attempts, completedAtMs: completedAtMs ?? nowMs,
            controller: controller, error: error)
        statistics.outcomesByController[.init(result.rawValue, controller ?? "-"), default: 0] += 1
        if item.request.loadTestRun != nil { statistics.loadTestOutcomes += 1 }
        let trace = item.trace.headers
        let update = ledger.complete(
            outcome, entitlement: item.request.entitlement, campaignID: item.request.campaignID,
            offerID: item.request.offerID, partition: item.ref.partition.number, grants: configuration.ledgerEnabled,
            known: item.identity, holdsState: false)
        let completed = outcome.completedAtMs
        // (The outcome moved in, not copied: it is not needed after.)
        var alongside: [(output: Output, unsent: UnsentOutput)] = [
            (
                .outcome(result, requestedAtMs: item.request.requestedAtMs),
                .outcome(consume outcome, trace: trace)
            )
        ]
        if let deadLetter {
            alongside.append(
                deadLetterOutput(
                    for: item.message, failure: deadLetter, attempts: attempts, requestID: item.request.requestID,
                    failedAtMs: completed))
        }
        // At least once, the user's next request starts once these outputs are acknowledged, and its
        // intent shares the changelog record of this result (``resultReady(_:)``). In a transaction
        // the lane is held to the end.
        outputs.publish(
            consume update, for: item.ref, item: item, alongside: alongside, result: item, trace: trace,
            user: item.lane)
    }

    /// Publishes a dead letter for a record no request of which is journaled (it did not decode).
    mutating func publishDeadLetter(
        for message: KafkaMessage, ref: RecordRef, failure: DeadLetterEvent.Failure, requestID: String?
    ) {
        let (output, unsent) = deadLetterOutput(for: message, failure: failure, attempts: 0, requestID: requestID)
        outputs.send(output, unsent, for: ref)
    }

    mutating func deadLetterOutput(
        for message: KafkaMessage, failure: DeadLetterEvent.Failure, attempts: Int, requestID: String?,
        failedAtMs: Int64? = nil
    ) -> (output: Output, unsent: UnsentOutput) {
        let letter = DeadLetterEvent(
            topic: message.topic, partition: message.partition, offset: message.offset, key: message.key,
            value: message.value, headers: message.headers.map { ($0.key, $0.value) }, error: failure,
            attempts: attempts, failedAtMs: failedAtMs ?? nowMs, requestID: requestID)
        statistics.deadLettersByClass[.init(failure.stage.rawValue, failure.errorClass), default: 0] += 1
        let (allowed, leftOut) = warnings.allow(now: now)
        logLeftOutDeadLetters(leftOut)
        if allowed {
            log(
                .warning, failure.stage == .controller ? "controller failed: dead letter" : "dead letter",
                fields: [
                    ("request_id", requestID ?? "-"), ("stage", failure.stage.rawValue),
                    ("class", failure.errorClass), ("topic", message.topic), ("partition", String(message.partition)),
                    ("offset", String(message.offset)), ("attempts", String(attempts)),
                ])
        }
        // The dead letter is keyed like its record, unless that key is too long to be a user's.
        let key = message.key.flatMap { $0.count <= DeadLetterEvent.maximumOriginalKeyBytes ? $0 : nil }
        return (.deadLetter, .deadLetter(letter, key: key, trace: TraceContext(message.headerBuffer).headers))
    }

    mutating func delivered(_ answers: [KafkaDelivery]) {
        var deliveries = answers
        if transactions != nil {
            transactions?.answered(deliveries.count)
            // A failed delivery dooms its transaction: never produced again, it stops the processor.
            for index in deliveries.indices {
                guard let error = deliveries[index].error else { continue }
                deliveries[index].error = KafkaError(
                    code: error.code, message: "in a transaction: \(error.message)", isRetriable: false, isFatal: true)
            }
        }
        defer { commitTransactionIfAnswered() }
        var redelivering: (count: Int, topic: String, error: KafkaError)? = nil
        defer {
            if let redelivering {
                log(
                    .warning,
                    "\(redelivering.count) deliveries failed (last: to \(redelivering.topic), \(redelivering.error)); producing them again, in order"
                )
            }
        }
        for event in outputs.delivered(deliveries, now: now) {
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
            case .intentWritten(let item):
                intentWritten(item)
            case .resultReady(let item):
                resultReady(item)
            case .redelivering(let topic, let error):
                statistics.redelivered += 1
                redelivering = ((redelivering?.count ?? 0) + 1, topic, error)
            case .fatal(let topic, let error):
                // Committing past this record would lose its output; stop instead and let a restart redo it.
                fail(ProcessorError(.outputLost, "cannot deliver to '\(topic)': \(error)"))
            }
        }
    }

    /// Every output of the record is acknowledged (its result is in the journal): its offset may
    /// be committed, and its user's next request may start unless ``resultReady(_:)`` let it.
    mutating func recordDone(_ ref: RecordRef, _ item: WorkItem?) {
        ownership.endWork(ref)
        finish(ref)
        if let item { statistics.stages.record(item.times, done: now) }
        // Its result's journal record is durable: an earlier version's entry of it leaves the state.
        if let item, ledger.hasLegacySettled,
            let update = ledger.dropLegacyEntry(userKey: item.lane.key, requestID: item.request.requestID)
        {
            outputs.publish(update, for: nil)
        }
        if let item, !item.laneReleased, let next = scheduler.releaseLane(item.lane) { start(next) }
    }

    /// The item's outcome (and dead letter, change events) is acknowledged, its result not yet in
    /// the changelog: at least once, the user's next request may start. Its intent is written in
    /// the same record as this result or a later one, so its call still starts after this result
    /// is durable. In a transaction the lane is held until the record is done.
    mutating func resultReady(_ item: WorkItem) {
        item.times.outputsAcknowledged(at: now)
        guard transactions == nil else { return }
        item.laneReleased = true
        if let next = scheduler.releaseLane(item.lane) { start(next) }
    }

    // MARK: Time

    mutating func logLeftOutDeadLetters(_ count: Int) {
        if count > 0 {
            log(.warning, "\(count) more dead letters in the last second (at most 10 a second are logged)")
        }
    }

    mutating func tick() {
        logLeftOutDeadLetters(warnings.endedWindowLeftOut(now: now))
        // Published on the clock, not per batch: a copy of the histogram per batch costs more than the work.
        statistics.assignedPartitions = ownership.assigned.count
        statistics.inFlight = calls.count
        statistics.lastTickAtMs = nowMs
        statistics.inDoubtOpen = calls.inDoubtCount
        (statistics.residentUsers, statistics.userLoads, statistics.userEvictions) = ledger.residentFigures
        statistics.oldestInDoubtSinceMs =
            calls.inDoubtCount == 0 ? nil : calls.calls.values.compactMap(\.item.inDoubtSinceMs).min()
        statistics.changesByKind = outputs.changesByKind
        emit(.publishStatistics)
        let due = calls.tick(now: now)
        let cancelled = due.filter { if case .cancel = $0 { true } else { false } }.count
        if cancelled > 0 {
            log(
                .warning,
                "\(cancelled) calls passed the call timeout (\(configuration.callTimeout)) and are cancelled; their users' next requests wait until they return"
            )
        }
        for action in due { perform(action) }
        if newlyInDoubt > 0 {
            log(
                .warning,
                "\(newlyInDoubt) requests in doubt: their attempts ran out with billing's answer unknown; published pending (outcome_unknown), asking billing again; \(calls.inDoubtCount) in doubt in all"
            )
            newlyInDoubt = 0
        }
        outputs.tick(now: now)
        if now >= nextJournalPrune {
            nextJournalPrune = now.advanced(by: .seconds(60))
            ledger.pruneJournals(nowMs: nowMs)
        }
        if !ownership.isDraining && ledger.keepsSomeUsers {
            // Users kept only in the store whose expiry is due are read, so that it is settled below.
            ledger.loadDueUsers(of: ownership.generations.keys.filter { $0.topic == .requests }.map(\.number))
        }
        if !ownership.isDraining, let due = ledger.nextExpiryMs, due <= nowMs {
            // Users of partitions being handed over are left to the next owner, which restores them.
            for update in ledger.expire(nowMs: nowMs)
            where ownership.generation(forNewRecordOf: .requests(update.partition)) != nil {
                outputs.publish(update, for: nil)
            }
        }
        if ledger.keepsSomeUsers {
            // Users read from the store may carry an earlier version's journal to write again.
            for update in ledger.takeLegacyCleanups() { outputs.publish(update, for: nil) }
            ledger.evict { outputs.hasUpdates(ofUser: $0) }
        }
        if transactions != nil {
            transactionTick(now: now)
        } else if !ownership.isDraining && !ownership.hasRevocations {
            commitIfDue(now: now)
        }
    }

    // MARK: Shutdown

    /// Stops taking records; running calls go on (bounded by their timeout) and their outputs are
    /// delivered, then the loop ends.
    mutating func beginDrain() {
        guard !ownership.isDraining else { return }
        ownership.beginDrain(now: now, timeout: configuration.drainTimeout)
        pause(ownership.generations.keys)
        released += scheduler.removeWaiting { _ in true }.count
        abandonWaitingForIntent { _ in true }
        for action in calls.handOver(where: { _ in true }, by: now.advanced(by: configuration.drainTimeout)) {
            perform(action)
        }
        abandonWaitingForSlot { _ in true }
    }

    mutating func checkDrained() {
        guard let deadline = ownership.drainDeadline else { return }
        if calls.isEmpty && outputs.isIdle {
            // Exactly-once: the last transaction commits the last outputs and offsets first (not
            // after a failure: what is uncommitted then is left to the restart).
            if let state = transactions, !state.isClosed, failure == nil {
                transactionTick(now: now, force: true)
                return
            }
            end()
        } else if now >= deadline && calls.isEmpty && !outputs.hasStateUpdates {
            // (Changelog writes are waited for: one landing after the next owner's restore would
            // set a user's journal back.)
            log(
                .error,
                "drain timed out with \(outputs.pendingRecords) records whose outputs are undelivered; they are not committed and will be processed again"
            )
            end()
        } else if now >= deadline.advanced(by: configuration.stuckCallLimit) {
            stop(stuck: "\(calls.count) calls ignored cancellation at shutdown")
        } else if now >= deadline, drainReportedAt.map({ now >= $0.advanced(by: configuration.drainTimeout) }) ?? true {
            // Never end with a call alive: its partitions would go to another member while it runs.
            drainReportedAt = now
            log(
                .error,
                "drain deadline passed with \(calls.count) calls running: cancelling them and waiting for them to return"
            )
            for action in calls.interrupt(where: { _ in true }) { perform(action) }
        }
    }

    /// Ends the loop without handing anything over: a call is still alive after the hand-over limit.
    /// ``PurchaseProcessor/run()`` throws ``ProcessorError/Code/callStuck``; the process must exit
    /// (ending the call with it) before the group gives the partitions to another member.
    mutating func stop(stuck reason: String) {
        guard !isFinished else { return }
        let error = ProcessorError(
            .callStuck,
            "\(reason) for longer than the hand-over allows (\(configuration.stuckCallLimit) past the drain timeout, within max.poll.interval.ms); stopping without handing the partitions over, so that the call cannot run beside their next owner"
        )
        log(.error, "\(error)")
        failure = error
        isFinished = true
        emit(.publishStatistics)
    }

    mutating func end() {
        isFinished = true
        // Nothing is in work: revocations still waiting are handed over with what finished.
        for revocation in ownership.takeRevocations() { handOver(revocation) }
        emit(.publishStatistics)
    }

    mutating func fail(_ error: ProcessorError) {
        log(.error, "\(error)")
        if failure == nil { failure = error }
        beginDrain()
    }
}
