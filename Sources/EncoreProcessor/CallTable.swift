import EncoreEvents

/// The controller calls of one loop: attempts, backoff, deadlines, timeouts and cancellation.
///
/// A call is over only when the controller has returned: a timeout cancels the call and waits for
/// it (the user's lane stays held meanwhile), so one user never has two purchases in billing at
/// once. A call that timed out had an unknown effect: it is tried again (a recovery call, as every
/// attempt after the first) while attempts remain. A pure state machine: the loop feeds it starts, results and the time, and carries out
/// the ``Action``s it returns.
struct CallTable<Item> {
    /// Where a call is: in the controller, waiting to retry, or cancelled and not yet returned.
    enum Phase: Equatable {
        case running
        /// Waiting to retry at `until`.
        case backingOff(until: ContinuousClock.Instant)
        /// Cancelled; waiting for the controller to return.
        case cancelling(Cancellation)

        var isBackingOff: Bool {
            if case .backingOff = self { return true }
            return false
        }
    }

    enum Cancellation: Equatable {
        /// The call passed its timeout.
        case timedOut
        /// Its partition's hand-over (or the shutdown) waited past its deadline.
        case interrupted
    }

    /// A request's call: its item, the partition it belongs to, and its attempt.
    struct Call {
        let item: Item
        let partition: InputPartition
        var attempt = 1
        var phase = Phase.running
    }

    /// How a call ended: the controller's answer, or a failure for the outcome and dead letter.
    enum Settlement {
        case answered(PurchaseResult)
        case failed(PurchaseOutcomeEvent.Failure)
        /// The controller declined before billing (``PurchaseNotAttempted``).
        case notAttempted(PurchaseOutcomeEvent.Failure)
    }

    enum Action {
        /// Call the controller (attempt `attempt`) and report with
        /// ``finished(_:attempt:_:now:retryUnit:retryDeadline:)``.
        case launch(call: Int, Item, attempt: Int)
        /// Cancel the running attempt; the table waits for it to return.
        case cancel(call: Int, Item)
        /// The call is over: publish this outcome (a dead letter too when it failed).
        case settle(Item, Settlement, attempts: Int)
        /// The call is over without an outcome (interrupted, or a retry that cannot finish before a
        /// hand-over): its record is left unfinished, for the next owner.
        case abandon(Item)
    }

    let timeout: Duration
    let retry: RetryPolicy
    private(set) var calls: [Int: Call] = [:]
    private var nextID = 0
    /// Running attempts by deadline; with one timeout for all, launch order is deadline order.
    private var deadlines = FIFO<(deadline: ContinuousClock.Instant, call: Int, attempt: Int)>()
    private var retries = TimerQueue<ContinuousClock.Instant, Int>()

    init(timeout: Duration, retry: RetryPolicy) {
        self.timeout = timeout
        self.retry = retry
    }

    var isEmpty: Bool { calls.isEmpty }
    var count: Int { calls.count }

    /// Starts a call for `item`, whose record belongs to `partition`, with attempt number
    /// `attempt` (more than 1 when an earlier process started the request).
    mutating func start(
        _ item: Item, partition: InputPartition, attempt: Int = 1, now: ContinuousClock.Instant
    ) -> Action {
        let id = nextID
        nextID += 1
        calls[id] = Call(item: item, partition: partition, attempt: attempt)
        deadlines.append((now.advanced(by: timeout), id, attempt))
        return .launch(call: id, item, attempt: attempt)
    }

    /// Attempt `attempt` of call `id` returned with `result`. `retryUnit` is a random value in
    /// [0, 1) for the backoff's jitter; `retryDeadline` gives, for a partition being handed over,
    /// when its calls must be over: a retry that cannot end by then is not made. (Asked only when
    /// a retry is due, so answers cost no lookup.)
    mutating func finished(
        _ id: Int, attempt: Int, _ result: Result<PurchaseResult, any Error>, now: ContinuousClock.Instant,
        retryUnit: Double, retryDeadline: (InputPartition) -> ContinuousClock.Instant?
    ) -> Action? {
        guard let call = calls[id], call.attempt == attempt, !call.phase.isBackingOff else { return nil }
        switch (call.phase, result) {
        case (_, .success(let answer)):
            // Also after a cancellation: a definite answer is what happened in billing.
            return end(id, .answered(answer))
        case (.cancelling(.timedOut), .failure):
            // Its effect is unknown: the next attempt is a recovery call, which looks before it charges.
            let failure = PurchaseOutcomeEvent.Failure(
                type: "timeout",
                message: "the controller did not answer within \(timeout) (attempt \(attempt) of \(retry.maxAttempts))",
                retryable: false)
            return retryOrEnd(id, call, failure: failure, now: now, retryUnit: retryUnit, retryDeadline: retryDeadline)
        case (.cancelling(.interrupted), .failure):
            calls[id] = nil
            return .abandon(call.item)
        case (_, .failure(let error as PurchaseNotAttempted)):
            return end(id, .notAttempted(.init(type: error.type, message: error.message, retryable: false)))
        case (_, .failure(let error as PurchaseControllerError)):
            let failure = PurchaseOutcomeEvent.Failure(
                type: error.type, message: error.message, retryable: error.isRetryable)
            guard error.isRetryable else { return end(id, .failed(failure)) }
            return retryOrEnd(id, call, failure: failure, now: now, retryUnit: retryUnit, retryDeadline: retryDeadline)
        case (_, .failure(let error)):
            return end(
                id, .failed(.init(type: String(describing: type(of: error)), message: "\(error)", retryable: false)))
        }
    }

    /// Backs off before the next attempt while attempts remain and it can end before the
    /// partition's hand-over; otherwise ends with `failure` (no attempts left) or leaves the
    /// record to the next owner.
    private mutating func retryOrEnd(
        _ id: Int, _ call: Call, failure: PurchaseOutcomeEvent.Failure, now: ContinuousClock.Instant,
        retryUnit: Double, retryDeadline: (InputPartition) -> ContinuousClock.Instant?
    ) -> Action? {
        guard retry.allowsRetry(after: call.attempt) else { return end(id, .failed(failure)) }
        let due = now.advanced(by: retry.backoff(after: call.attempt, unit: retryUnit))
        if let deadline = retryDeadline(call.partition), due.advanced(by: timeout) > deadline {
            // The next owner retries, as a recovery call.
            calls[id] = nil
            return .abandon(call.item)
        }
        calls[id]!.phase = .backingOff(until: due)
        retries.schedule(id, at: due)
        return nil
    }

    private mutating func end(_ id: Int, _ settlement: Settlement) -> Action {
        let call = calls.removeValue(forKey: id)!
        return .settle(call.item, settlement, attempts: call.attempt)
    }

    /// Cancels attempts past their timeout and launches retries that are due.
    mutating func tick(now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = []
        // Entries of attempts that already ended are dropped as they reach the front, so the
        // queue holds about the attempts in flight.
        while let first = deadlines.first,
            first.deadline <= now
                || calls[first.call].map({ $0.attempt != first.attempt || $0.phase != .running })
                    ?? true
        {
            _ = deadlines.popFirst()
            guard let call = calls[first.call], call.attempt == first.attempt, call.phase == .running else { continue }
            calls[first.call]!.phase = .cancelling(.timedOut)
            actions.append(.cancel(call: first.call, call.item))
        }
        for id in retries.popDue(now: now) {
            guard let call = calls[id], call.phase.isBackingOff else { continue }
            calls[id]!.attempt += 1
            calls[id]!.phase = .running
            deadlines.append((now.advanced(by: timeout), id, call.attempt + 1))
            actions.append(.launch(call: id, call.item, attempt: call.attempt + 1))
        }
        return actions
    }

    /// Partitions are being handed over by `deadline`: a waiting retry that cannot end by then is
    /// dropped (its record is left to the next owner); running calls go on.
    mutating func handOver(
        where isLeaving: (InputPartition) -> Bool, by deadline: ContinuousClock.Instant
    ) -> [Action] {
        let timeout = self.timeout
        return abandon { call in
            guard case .backingOff(let due) = call.phase, isLeaving(call.partition) else { return false }
            return due.advanced(by: timeout) > deadline
        }
    }

    /// The hand-over of these partitions is overdue: running calls are cancelled (and waited
    /// for), waiting retries dropped.
    mutating func interrupt(where isLeaving: (InputPartition) -> Bool) -> [Action] {
        var actions = abandon { $0.phase.isBackingOff && isLeaving($0.partition) }
        for (id, call) in calls where call.phase == .running && isLeaving(call.partition) {
            calls[id]!.phase = .cancelling(.interrupted)
            actions.append(.cancel(call: id, call.item))
        }
        return actions
    }

    private mutating func abandon(where predicate: (Call) -> Bool) -> [Action] {
        let dropped = calls.filter { predicate($0.value) }
        for id in dropped.keys { calls[id] = nil }
        return dropped.values.map { .abandon($0.item) }
    }
}
