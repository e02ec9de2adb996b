import EncoreEvents
import Kafka

/// The request journal's side of the worker: a call starts once its intent is durable, within the
/// call bound; a failure is journaled before it is published; a request in doubt keeps its
/// intent open and its lane held until billing answers.
extension Worker {
    /// Starts `first`; an item that ends without a call or outputs frees its slot and lane, which
    /// starts at most one other.
    ///
    /// The user's journal decides: a request with a recorded result is a duplicate (finished, no
    /// outputs) unless its content differs (a `request_id_conflict`); one with an intent and no
    /// result was started by an earlier process and is called again only as a recovery call,
    /// after the earlier call could no longer be running. Otherwise the intent is written first,
    /// and the call starts once it is durable (``intentWritten(_:)``).
    mutating func start(_ first: WorkItem) {
        var ready: WorkItem? = first
        while let item = ready {
            ready = nil
            item.times.start(at: now)
            let journaled = ledger.journalEntry(
                ofUser: item.lane.key, requestID: item.request.requestID, partition: item.ref.partition.number,
                requestKey: item.identity.requestKey)
            if let journaled, let digest = journaled.digest, digest != item.digest {
                rejectConflict(item, journaled)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
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
                if logsDebug {
                    log(
                        .debug, "request already answered: a duplicate, not called again",
                        fields: [("request_id", item.request.requestID), ("offset", "\(item.ref.offset)")])
                }
                finish(item.ref)
                ready = scheduler.finish(lane: item.lane)
                continue
            }
            ownership.beginWork(item.ref)
            if let journaled {
                ready = recover(item, journaled)
                continue
            }
            if configuration.enforcesDeadlines, let deadline = item.request.deadlineAtMs, nowMs > deadline {
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
            if intentsAhead < intentWindow {
                publishIntent(item)
            } else {
                waitingForIntent.append(item)
            }
        }
    }

    /// Journals the first intent of a new request; its call starts once it is durable.
    mutating func publishIntent(_ item: WorkItem) {
        intentsAhead += 1
        item.holdsPlaceAhead = true
        item.intentAt = now
        let intent = ledger.recordIntent(
            item.request, attempt: item.firstAttempt, partition: item.ref.partition.number,
            nowMs: nowMs, offset: item.ref.offset, digest: item.digest, known: item.identity, holdsState: false)
        outputs.publish(consume intent, for: nil, intent: item, user: item.lane)
    }

    /// The item's first call entered the call table, or will never be made here: its place ahead
    /// of the calls goes to the next new request waiting for one.
    mutating func leaveIntentWindow(_ item: WorkItem) {
        guard item.holdsPlaceAhead else { return }
        item.holdsPlaceAhead = false
        intentsAhead -= 1
        while intentsAhead < intentWindow, failure == nil, let next = waitingForIntent.popFirst() {
            publishIntent(next)
        }
    }

    /// A request an earlier process started (an open intent): its earlier call may have reached
    /// billing, so it is never "not attempted" and never called as new. Its user's lane stays
    /// held until that call could no longer be running anywhere (the intent's time plus the call
    /// timeout and the clock-skew margin); then billing is asked with a recovery call. A request
    /// journaled in doubt goes on being reconciled until `--reconcile-for` past that time.
    /// Returns an item to start when this one ended at once (billing cannot be asked).
    mutating func recover(_ item: WorkItem, _ journaled: EntitlementStateRecord.RequestEntry) -> WorkItem? {
        statistics.recovered += 1
        item.firstAttempt = journaled.attempts + 1
        item.inDoubtSinceMs = journaled.inDoubtSinceMs
        guard let route = router.controller(for: item.request.productID) else {
            // Billing cannot be asked: for a person, never a guess.
            expire(
                item,
                .init(
                    type: "in_doubt_expired",
                    message:
                        "no controller is routed for product \(item.request.productID) to ask whether an earlier call (attempt \(journaled.attempts)) reached billing",
                    retryable: false),
                attempts: journaled.attempts)
            return scheduler.endCall(lane: item.lane)
        }
        item.controllerName = route.name
        item.controller = route.controller
        let callOver =
            journaled.startedAtMs
            + Int64((configuration.callTimeout + configuration.reconciliation.clockSkewMargin).milliseconds)
        if callOver > nowMs { item.takeoverHold = now.advanced(by: .milliseconds(callOver - nowMs)) }
        if let since = journaled.inDoubtSinceMs {
            let until = since + Int64(configuration.reconciliation.duration.milliseconds)
            item.inDoubtUntil = now.advanced(by: .milliseconds(until - nowMs))
            item.inDoubtFor = .milliseconds(max(0, nowMs - since))
        }
        startCall(item)
        return nil
    }

    /// A record reusing a journaled `request_id` with other content: a dead letter naming both
    /// records; the journaled request is left as it is.
    mutating func rejectConflict(_ item: WorkItem, _ journaled: EntitlementStateRecord.RequestEntry) {
        ownership.beginWork(item.ref)
        statistics.requestIDConflicts += 1
        let first =
            journaled.offset.map { "offset \($0) of partition \(item.ref.partition.number)" } ?? "an earlier record"
        publishDeadLetter(
            for: item.message, ref: item.ref,
            failure: .init(
                stage: .validate, errorClass: "request_id_conflict",
                message:
                    "request_id '\(item.request.requestID)' was first used by \(first) with other content (digest \(journaled.digest ?? "-"), this record's \(item.digest)); this record (offset \(item.message.offset)) is not processed",
                retryable: false),
            requestID: item.request.requestID)
    }

    /// The item's intent is durable (exactly-once: in the transaction, whose commit makes it so),
    /// or its decided failure: that is published now.
    mutating func intentWritten(_ item: WorkItem) {
        if item.decidedFailure != nil {
            publishDecidedFailure(item)
        } else if transactions != nil {
            transactions?.hold(intent: item)
        } else {
            intentDurable(item)
        }
    }

    /// The intent of the item's next call is durable: a first call starts (within the bound), a
    /// later attempt launches. An intent durable past ``ReconcilePolicy/launchAllowance`` starts
    /// no call: a next owner finding it open may take that call to be over before it would be
    /// (the late intent was seen on a loaded machine, an exactly-once commit acknowledged seconds
    /// late, in a member the group had replaced meanwhile). The request is asked as that owner
    /// would ask it: a recovery call once the owner's hold is over.
    mutating func intentDurable(_ item: WorkItem) {
        item.times.intentDurable(at: now)
        guard let (id, attempt) = item.journalingCall else {
            let reconcile = configuration.reconciliation
            if let intentAt = item.intentAt, reconcile.startsTooLate(intentAt: intentAt, now: now) {
                statistics.lateIntents.held += 1
                item.intentAt = nil
                item.firstAttempt += 1
                item.takeoverHold = reconcile.callOver(intentAt: intentAt, callTimeout: configuration.callTimeout)
            }
            startCall(item)
            return
        }
        item.journalingCall = nil
        // A failing loop or a partition no longer owned makes no call.
        guard failure == nil && ownership.owns(item.ref) else {
            if let action = calls.intentLost(id) { perform(action) }
            return
        }
        let action = calls.journaled(
            id, attempt: attempt, now: now, handOverDeadline: ownership.deadline(of: item.ref.partition))
        guard case .wait? = action else {
            if let action { perform(action) }
            return
        }
        // Durable too late (the call table holds it as a next owner would): its slot is free.
        statistics.lateIntents.held += 1
        startWaitingCalls()
    }

    /// Starts the call of an item, unless the loop is failing or the call could not end before
    /// its partition's hand-over (the next owner calls it, as a recovery). A new request's intent
    /// is durable already; a recovery's is written once its takeover hold is over. A new request
    /// whose slot came past ``ReconcilePolicy/launchAllowance`` after its intent writes the intent
    /// again, and starts once that one is durable: a next owner takes a call to start by then.
    mutating func startCall(_ item: WorkItem) {
        let handOverDeadline = ownership.deadline(of: item.ref.partition)
        // (A takeover's call starts once its hold is over.)
        let startsAt = max(now, item.takeoverHold ?? now)
        guard failure == nil, ownership.owns(item.ref),
            handOverDeadline.map({ startsAt.advanced(by: configuration.callTimeout) <= $0 }) ?? true
        else {
            perform(.abandon(item))
            return
        }
        let isRecovery = item.firstAttempt > 1
        // A takeover's hold takes no slot while it lasts.
        guard calls.hasFreeSlot || item.takeoverHold.map({ $0 > now }) == true else {
            waitingForSlot.append(item)
            return
        }
        var journalAfter = isRecovery ? item.takeoverHold ?? now : nil
        if let intentAt = item.intentAt {
            item.intentAt = nil
            if configuration.reconciliation.startsTooLate(intentAt: intentAt, now: now) {
                statistics.lateIntents.rewritten += 1
                journalAfter = now
            }
        }
        let action = calls.start(
            item, partition: item.ref.partition, attempt: item.firstAttempt, now: now,
            journalAfter: journalAfter, inDoubtUntil: item.inDoubtUntil, inDoubtFor: item.inDoubtFor)
        perform(action)
        leaveIntentWindow(item)
        statistics.peakInFlight = max(statistics.peakInFlight, calls.count)
    }

    /// A call left the table: the items waiting for a slot start, up to the bound.
    mutating func startWaitingCalls() {
        while calls.hasFreeSlot, let item = waitingForSlot.popFirst() { startCall(item) }
    }

    /// A failed call (or one that cannot be made): journaled first, published once that is
    /// durable (``intentWritten(_:)``), so every outcome of the request says the same.
    mutating func journalFailure(_ item: WorkItem, _ error: PurchaseOutcomeEvent.Failure, attempts: Int) {
        let now = nowMs
        item.decidedFailure = (error, attempts, now)
        let update = ledger.recordFailure(
            item.request, attempts: attempts, error: error,
            controller: item.controllerName.isEmpty ? nil : item.controllerName, offset: item.ref.offset,
            partition: item.ref.partition.number, nowMs: now)
        outputs.publish(update, for: nil, intent: item)
    }

    /// Publishes the journaled failure of `item`: its outcome and dead letter, as journaled.
    mutating func publishDecidedFailure(_ item: WorkItem) {
        guard let failure = item.decidedFailure else { return }
        let error = failure.error
        publishOutcome(
            item, result: .failed, attempts: failure.attempts,
            controller: item.controllerName.isEmpty ? nil : item.controllerName, error: error,
            deadLetter: .init(
                stage: .controller, errorClass: error.type, message: error.message, retryable: error.retryable),
            completedAtMs: failure.completedAtMs)
    }

    // MARK: In doubt

    /// The attempts ran out with billing's answer unknown: `pending` (`outcome_unknown`) is
    /// published with the journal's in-doubt mark, nothing is granted, and the record stays
    /// unfinished (its offset is not committed: a restart reads it again and goes on asking). The
    /// user's lane stays held; the call table asks billing again.
    mutating func doubt(_ item: WorkItem, _ failure: PurchaseOutcomeEvent.Failure, attempts: Int) {
        item.inDoubtSinceMs = nowMs
        statistics.inDoubtOpened += 1
        newlyInDoubt += 1
        let update = ledger.recordInDoubt(
            item.request, attempts: attempts, partition: item.ref.partition.number, nowMs: nowMs)
        let trace = item.trace.headers
        outputs.publish(
            update, for: nil,
            alongside: [pendingOutcome(item, attempts: attempts, nowMs: nowMs, trace: trace)], trace: trace)
        guard logsDebug else { return }
        log(
            .debug, "request in doubt: pending published, asking billing again",
            fields: [("request_id", item.request.requestID), ("last", "\(failure.type): \(failure.message)")])
    }

    /// Billing gave no definite answer within `--reconcile-for` (or cannot be asked): a dead
    /// letter `in_doubt_expired` for a person to settle, the journal closed (a re-read is a
    /// duplicate), and the outcome stays `pending` (published now if it was not yet).
    mutating func expire(_ item: WorkItem, _ failure: PurchaseOutcomeEvent.Failure, attempts: Int) {
        statistics.inDoubtExpired += 1
        let trace = item.trace.headers
        var alongside = [
            deadLetterOutput(
                for: item.message,
                failure: .init(
                    stage: .controller, errorClass: failure.type, message: failure.message, retryable: false),
                attempts: attempts, requestID: item.request.requestID, failedAtMs: nowMs)
        ]
        if item.inDoubtSinceMs == nil {
            alongside.insert(pendingOutcome(item, attempts: attempts, nowMs: nowMs, trace: trace), at: 0)
        }
        let update = ledger.recordFailure(
            item.request, attempts: attempts, error: failure,
            controller: item.controllerName.isEmpty ? nil : item.controllerName, offset: item.ref.offset,
            partition: item.ref.partition.number, nowMs: nowMs, result: .pending)
        outputs.publish(update, for: item.ref, item: item, alongside: alongside, result: item, trace: trace)
    }

    /// The `pending` (`outcome_unknown`) outcome of an in-doubt request, counted as published.
    mutating func pendingOutcome(_ item: WorkItem, attempts: Int, nowMs: Int64, trace: [KafkaHeader]) -> (
        output: Output, unsent: UnsentOutput
    ) {
        let controller = item.controllerName.isEmpty ? nil : item.controllerName
        statistics.outcomesByController[.init(OutcomeResult.pending.rawValue, controller ?? "-"), default: 0] += 1
        let outcome = PurchaseOutcomeEvent(
            request: item.request, result: .pending, attempts: attempts, completedAtMs: nowMs, controller: controller,
            pendingReason: .outcomeUnknown)
        return (.outcome(.pending, requestedAtMs: item.request.requestedAtMs), .outcome(outcome, trace: trace))
    }
}
