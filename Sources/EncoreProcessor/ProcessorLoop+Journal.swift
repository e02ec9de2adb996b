import EncoreEvents

/// The request journal's side of the loop: a call starts once its intent is durable, within the
/// call bound; a failure is journaled before it is published.
extension ProcessorLoop {
    /// Starts `first`; an item that ends without a call or outputs frees its slot and lane, which
    /// starts at most one other.
    ///
    /// The user's journal decides: a request with a recorded result is a duplicate (finished, no
    /// outputs); one with an intent and no result was started by an earlier process and is
    /// called again only as a recovery call. Otherwise the intent is written first, and the call
    /// starts once it is durable (``intentWritten(_:)``).
    func start(_ first: WorkItem) {
        var ready: WorkItem? = first
        while let item = ready {
            ready = nil
            let journaled = ledger.journalEntry(ofUser: item.lane.key, requestID: item.request.requestID)
            if let journaled, journaled.result == .failed, let error = journaled.error,
                journaled.offset == item.ref.offset, let completedAtMs = journaled.completedAtMs
            {
                // The same record again: its failure was journaled before its outcome, which may
                // not have been published. Published again, identical.
                ownership.beginWork(item.ref)
                item.decidedFailure = (error, journaled.attempts, completedAtMs)
                item.controllerName = journaled.controller ?? ""
                publishDecidedFailure(item)
                statistics.republished += 1
                ready = scheduler.endCall(lane: item.lane)
                continue
            }
            if journaled?.result != nil {
                statistics.duplicates += 1
                finish(item.ref)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            ownership.beginWork(item.ref)
            if let journaled {
                // Its earlier call may have reached billing: never "not attempted", always asked
                // again, unless its attempts ran out (then failed, for reconciliation).
                item.firstAttempt = journaled.attempts + 1
                statistics.recovered += 1
                let route = router.controller(for: item.request.productID)
                guard journaled.attempts < configuration.retry.maxAttempts, route != nil else {
                    item.controllerName = route?.name ?? ""
                    journalFailure(
                        item,
                        route == nil
                            ? .init(
                                type: "no_controller",
                                message:
                                    "no controller is routed for product \(item.request.productID) and an earlier call may have reached billing",
                                retryable: false)
                            : .init(
                                type: "attempts_exhausted",
                                message:
                                    "\(journaled.attempts) calls were started before a restart, the most allowed (--max-attempts)",
                                retryable: false),
                        attempts: journaled.attempts)
                    ready = scheduler.endCall(lane: item.lane)
                    continue
                }
            } else if configuration.enforcesDeadlines, let deadline = item.request.deadlineAtMs,
                currentTimeMs() > deadline
            {
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
            let intent = ledger.recordIntent(
                item.request, attempt: item.firstAttempt, partition: item.ref.partition.number,
                nowMs: currentTimeMs())
            outputs.publish(intent, for: nil, intent: item)
        }
    }

    /// The item's intent is durable (exactly-once: in the transaction, whose commit makes it so),
    /// or its decided failure: that is published now.
    func intentWritten(_ item: WorkItem) {
        if item.decidedFailure != nil {
            publishDecidedFailure(item)
        } else if transactions != nil {
            transactions!.intents.append(item)
        } else {
            startCall(item)
        }
    }

    /// Starts the call of an item whose intent is durable, unless the loop is failing or the call
    /// could not end before its partition's hand-over (the next owner calls it, as a recovery).
    func startCall(_ item: WorkItem) {
        let now = clock.now
        let handOverDeadline = ownership.deadline(of: item.ref.partition)
        guard failure == nil, ownership.owns(item.ref),
            handOverDeadline.map({ now.advanced(by: configuration.callTimeout) <= $0 }) ?? true
        else {
            perform(.abandon(item))
            return
        }
        guard calls.count < configuration.maxInFlight else {
            waitingForSlot.append(item)
            return
        }
        perform(calls.start(item, partition: item.ref.partition, attempt: item.firstAttempt, now: now))
        statistics.peakInFlight = max(statistics.peakInFlight, calls.count)
    }

    /// A call left the table: the items waiting for a slot start, up to the bound.
    func startWaitingCalls() {
        while calls.count < configuration.maxInFlight, let item = waitingForSlot.popFirst() { startCall(item) }
    }

    /// A failed call (or one that cannot be made): journaled first, published once that is
    /// durable (``intentWritten(_:)``), so every outcome of the request says the same.
    func journalFailure(_ item: WorkItem, _ error: PurchaseOutcomeEvent.Failure, attempts: Int) {
        let now = currentTimeMs()
        item.decidedFailure = (error, attempts, now)
        let update = ledger.recordFailure(
            item.request, attempts: attempts, error: error,
            controller: item.controllerName.isEmpty ? nil : item.controllerName, offset: item.ref.offset,
            partition: item.ref.partition.number, nowMs: now)
        outputs.publish(update, for: nil, intent: item)
    }

    /// Publishes the journaled failure of `item`: its outcome and dead letter, as journaled.
    func publishDecidedFailure(_ item: WorkItem) {
        guard let failure = item.decidedFailure else { return }
        let error = failure.error
        publishOutcome(
            item, result: .failed, attempts: failure.attempts,
            controller: item.controllerName.isEmpty ? nil : item.controllerName, error: error,
            deadLetter: .init(
                stage: .controller, errorClass: error.type, message: error.message, retryable: error.retryable),
            completedAtMs: failure.completedAtMs)
    }
}
