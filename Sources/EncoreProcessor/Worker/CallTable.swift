import EncoreEvents

/// The controller calls of one loop: attempts, backoff, deadlines, timeouts, cancellation, and
/// the reconciliation of requests in doubt.
///
/// A call is over only when the controller has returned: a timeout cancels the call and waits for
/// it (the user's lane stays held meanwhile), so one user never has two purchases in billing at
/// once. Every attempt after a request's first is a recovery call, and its intent is durable
/// before it starts (``Action/journal(call:_:attempt:)``), so that a next owner knows how long the
/// call could still run.
///
/// When the attempts run out and the last one's effect is unknown (a timeout, or an error with
/// ``PurchaseControllerError/isOutcomeUnknown``), the request is *in doubt*
/// (``Action/doubt(_:_:attempts:)``): the call stays here, waiting, and asks billing again with
/// capped exponential backoff until billing gives a definite answer or the reconciliation time
/// runs out (``Settlement/expired(_:)``). A call waiting to ask holds its user's lane but no call
/// slot (a retry's backoff holds one).
///
/// A pure state machine: the loop feeds it starts, durable intents, results and the time, and
/// carries out the ``Action``s it returns.
struct CallTable<Item> {
    /// Where a call is.
    enum Phase: Equatable {
        /// In the controller.
        case running
        /// The intent of `attempt` is being made durable; it launches once it is.
        case journaling(attempt: Int)
        /// Waiting until `until` to make attempt `next`: a retry's backoff (holding a call slot),
        /// or a wait that holds none (an in-doubt request between asks, a takeover's hold).
        case waiting(until: ContinuousClock.Instant, next: Int, holdsSlot: Bool)
        /// Cancelled; waiting for the controller to return.
        case cancelling(Cancellation)

        var isWaiting: Bool {
            if case .waiting = self { return true }
            return false
        }

        /// Whether the call counts against the bound of calls at once.
        var holdsSlot: Bool {
            if case .waiting(_, _, let holdsSlot) = self { return holdsSlot }
            return true
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
        var attempt: Int
        var phase: Phase
        /// The last attempt a failure may be retried before; an unknown effect then is in doubt.
        let lastAttempt: Int
        /// Whether billing may have acted on an attempt so far: one ended unknown, or an earlier
        /// process started the request. A request that may have charged is never `failed` for a
        /// later attempt's error that is known not to have reached billing.
        var mayHaveActed: Bool
        /// Set once in doubt: when reconciliation gives up, and the asks made since.
        var reconciling: (deadline: ContinuousClock.Instant, asks: Int)?
        /// When the intent of the attempt being journaled was written (its `started_at_ms`).
        var intentAt: ContinuousClock.Instant? = nil
    }

    /// How a call ended: the controller's answer, or a failure for the outcome and dead letter.
    enum Settlement {
        case answered(PurchaseResult)
        case failed(PurchaseOutcomeEvent.Failure)
        /// The controller declined before billing (``PurchaseNotAttempted``).
        case notAttempted(PurchaseOutcomeEvent.Failure)
        /// In doubt past the reconciliation time: billing never answered. Its outcome stays
        /// `pending`; a person settles it (dead letter `in_doubt_expired`).
        case expired(PurchaseOutcomeEvent.Failure)

        var isExpiry: Bool {
            if case .expired = self { return true }
            return false
        }
    }

    enum Action {
        /// Call the controller (attempt `attempt`) and report with
        /// ``finished(_:attempt:_:now:retryUnit:retryDeadline:)``.
        case launch(call: Int, Item, attempt: Int)
        /// Make the intent of attempt `attempt` durable, then report
        /// ``journaled(_:attempt:now:handOverDeadline:)`` (or ``intentLost(_:)``).
        case journal(call: Int, Item, attempt: Int)
        /// Nothing to do until the takeover's hold is over (``tick(now:slots:)`` journals it then).
        case wait(Item)
        /// Cancel the running attempt; the table waits for it to return.
        case cancel(call: Int, Item)
        /// The call is over: publish this outcome (a dead letter too when it failed).
        case settle(Item, Settlement, attempts: Int)
        /// The attempts are used up and billing's answer is unknown: publish `pending`
        /// (`outcome_unknown`), grant nothing, keep the lane. The table asks billing again.
        case doubt(Item, PurchaseOutcomeEvent.Failure, attempts: Int)
        /// The call is over without an outcome (interrupted, or a retry that cannot finish before a
        /// hand-over): its record is left unfinished, for the next owner.
        case abandon(Item)
    }

    let timeout: Duration
    let retry: RetryPolicy
    let reconcile: ReconcilePolicy
    /// The call bound (`--max-in-flight`, this worker's share): the one place it is kept. Calls
    /// holding a slot never exceed it; the loop starts a call only when ``hasFreeSlot``.
    let limit: Int
    private(set) var calls: [Int: Call] = [:]
    private var nextID = 0
    /// Running attempts by deadline; with one timeout for all, launch order is deadline order.
    private var deadlines = FIFO<(deadline: ContinuousClock.Instant, call: Int, attempt: Int)>()
    private var timers = TimerQueue<ContinuousClock.Instant, Int>()
    /// Calls waiting without a slot (in doubt between asks, or held at a takeover).
    private(set) var idleCount = 0
    /// Calls in doubt (waiting or asking).
    private(set) var inDoubtCount = 0

    init(timeout: Duration, retry: RetryPolicy, reconcile: ReconcilePolicy = ReconcilePolicy(), limit: Int = .max) {
        precondition(limit > 0)
        self.limit = limit
        self.timeout = timeout
        self.retry = retry
        self.reconcile = reconcile
    }

    var isEmpty: Bool { calls.isEmpty }
    /// Calls holding a slot: running, cancelling, journaling or backing off to retry.
    var count: Int { calls.count - idleCount }
    /// Whether a call may start now without passing the bound.
    var hasFreeSlot: Bool { count < limit }

    /// Starts a call for `item`, whose record belongs to `partition`, with attempt number
    /// `attempt` (more than 1 when an earlier process started the request). Its intent is durable,
    /// unless `journalAfter` is given (a recovery found at takeover): then the attempt's intent is
    /// written at that time (an earlier owner's call may run until then) before it launches.
    /// `inDoubtUntil`: the request is in doubt already (journaled so), reconciled until then;
    /// `inDoubtFor`: for how long, so that its asks go on backing off where they were (a
    /// rebalance storm does not start them over).
    mutating func start(
        _ item: Item, partition: InputPartition, attempt: Int = 1, now: ContinuousClock.Instant,
        journalAfter: ContinuousClock.Instant? = nil, inDoubtUntil: ContinuousClock.Instant? = nil,
        inDoubtFor: Duration = .zero
    ) -> Action {
        let id = nextID
        nextID += 1
        var call = Call(
            item: item, partition: partition, attempt: attempt, phase: .running,
            // A recovery past the attempts still gets its one call, in doubt if that is unknown too.
            lastAttempt: inDoubtUntil == nil ? max(retry.maxAttempts, attempt) : attempt, mayHaveActed: attempt > 1)
        if let inDoubtUntil {
            call.reconciling = (inDoubtUntil, reconcile.asks(within: inDoubtFor))
            inDoubtCount += 1
        }
        switch journalAfter {
        case .some(let hold) where hold > now:
            call.phase = .waiting(until: hold, next: attempt, holdsSlot: false)
            idleCount += 1
            calls[id] = call
            timers.schedule(id, at: hold)
            return .wait(item)
        case .some:
            call.phase = .journaling(attempt: attempt)
            call.intentAt = now
            calls[id] = call
            return .journal(call: id, item, attempt: attempt)
        case nil:
            calls[id] = call
            deadlines.append((now.advanced(by: timeout), id, attempt))
            return .launch(call: id, item, attempt: attempt)
        }
    }

    /// Call `id`'s intent became durable too late to launch (``ReconcilePolicy/launchAllowance``):
    /// the call waits, with no slot, until a next owner would take it to be over (the intent's
    /// time, the call timeout and the clock-skew margin), then journals its next attempt: a
    /// recovery call, which looks before it charges. Billing may have been asked by then (by that
    /// next owner).
    private mutating func holdLikeANextOwner(_ id: Int, intentAt: ContinuousClock.Instant) -> Action {
        let hold = reconcile.callOver(intentAt: intentAt, callTimeout: timeout)
        let next = calls[id]!.attempt + 1
        calls[id]!.phase = .waiting(until: hold, next: next, holdsSlot: false)
        calls[id]!.mayHaveActed = true
        calls[id]!.intentAt = nil
        idleCount += 1
        timers.schedule(id, at: hold)
        return .wait(calls[id]!.item)
    }

    /// The intent of attempt `attempt` of call `id` is durable: it launches, unless it could not
    /// end before its partition's hand-over (`handOverDeadline`), when it is left to the next owner.
    mutating func journaled(
        _ id: Int, attempt: Int, now: ContinuousClock.Instant, handOverDeadline: ContinuousClock.Instant?
    ) -> Action? {
        guard let call = calls[id], call.phase == .journaling(attempt: attempt) else { return nil }
        if let handOverDeadline, now.advanced(by: timeout) > handOverDeadline {
            drop(id)
            return .abandon(call.item)
        }
        calls[id]!.attempt = attempt
        if let intentAt = call.intentAt, reconcile.startsTooLate(intentAt: intentAt, now: now) {
            return holdLikeANextOwner(id, intentAt: intentAt)
        }
        calls[id]!.phase = .running
        calls[id]!.intentAt = nil
        deadlines.append((now.advanced(by: timeout), id, attempt))
        return .launch(call: id, call.item, attempt: attempt)
    }

    /// Attempt `attempt` of call `id` returned with `result`. `retryUnit` is a random value in
    /// [0, 1) for the backoff's jitter; `retryDeadline` gives, for a partition being handed over,
    /// when its calls must be over: a retry that cannot end by then is not made. (Asked only when
    /// a retry is due, so answers cost no lookup.)
    mutating func finished(
        _ id: Int, attempt: Int, _ result: Result<PurchaseResult, any Error>, now: ContinuousClock.Instant,
        retryUnit: Double, retryDeadline: (InputPartition) -> ContinuousClock.Instant?
    ) -> Action? {
        guard let call = calls[id], call.attempt == attempt, call.phase == .running || call.phase.isCancelling
        else { return nil }
        let failure: PurchaseOutcomeEvent.Failure
        switch (call.phase, result) {
        case (_, .success(let answer)):
            // Also after a cancellation: a definite answer is what happened in billing.
            return end(id, .answered(answer))
        case (.cancelling(.interrupted), .failure):
            drop(id)
            return .abandon(call.item)
        case (.cancelling(.timedOut), .failure):
            // Its effect is unknown: the next attempt is a recovery call, which looks before it charges.
            calls[id]!.mayHaveActed = true
            failure = .init(
                type: "timeout",
                message: "the controller did not answer within \(timeout) (attempt \(attempt))",
                retryable: true)
        case (_, .failure(let error as PurchaseNotAttempted)):
            return end(id, .notAttempted(.init(type: error.type, message: error.message, retryable: false)))
        case (_, .failure(let error as PurchaseControllerError)):
            failure = .init(type: error.type, message: error.message, retryable: error.isRetryable)
            // An unknown effect is never a definite failure, whatever else the error says.
            if error.isOutcomeUnknown { calls[id]!.mayHaveActed = true }
            if !error.isRetryable && !error.isOutcomeUnknown { return end(id, .failed(failure)) }
            if !calls[id]!.mayHaveActed && call.attempt >= call.lastAttempt {
                // Billing acted on no attempt: a definite failure.
                return end(id, .failed(failure))
            }
        case (_, .failure(let error)):
            return end(
                id, .failed(.init(type: String(describing: type(of: error)), message: "\(error)", retryable: false)))
        }
        if call.attempt < call.lastAttempt {
            return retryOrAbandon(id, call, now: now, retryUnit: retryUnit, retryDeadline: retryDeadline)
        }
        if retryDeadline(call.partition) != nil {
            // Its partition is being handed over: the next owner reads the journal, holds the
            // user until this call could no longer run, and asks billing itself.
            drop(id)
            return .abandon(call.item)
        }
        if call.reconciling != nil {
            return askAgain(id, failure: failure, now: now, unit: retryUnit)
        }
        // No attempts left and billing may have acted: in doubt, never failed.
        calls[id]!.reconciling = (now.advanced(by: reconcile.duration), 0)
        inDoubtCount += 1
        waitToAsk(id, now: now, unit: retryUnit)
        return .doubt(call.item, failure, attempts: attempt)
    }

    /// Backs off before the next attempt if it can end before the partition's hand-over;
    /// otherwise leaves the record to the next owner.
    private mutating func retryOrAbandon(
        _ id: Int, _ call: Call, now: ContinuousClock.Instant, retryUnit: Double,
        retryDeadline: (InputPartition) -> ContinuousClock.Instant?
    ) -> Action? {
        let due = now.advanced(by: retry.backoff(after: call.attempt, unit: retryUnit))
        if let deadline = retryDeadline(call.partition), due.advanced(by: timeout) > deadline {
            // The next owner retries, as a recovery call.
            drop(id)
            return .abandon(call.item)
        }
        calls[id]!.phase = .waiting(until: due, next: call.attempt + 1, holdsSlot: true)
        timers.schedule(id, at: due)
        return nil
    }

    /// An in-doubt call's ask gave no definite answer: it waits to ask again (without a slot),
    /// or, past the reconciliation time, expires.
    private mutating func askAgain(
        _ id: Int, failure: PurchaseOutcomeEvent.Failure, now: ContinuousClock.Instant, unit: Double
    ) -> Action? {
        guard let deadline = calls[id]!.reconciling?.deadline else { return nil }
        if now >= deadline {
            return end(
                id,
                .expired(
                    .init(
                        type: "in_doubt_expired",
                        message:
                            "billing gave no definite answer within the reconciliation time (--reconcile-for, \(reconcile.duration)); last: \(failure.type): \(failure.message)",
                        retryable: false)))
        }
        waitToAsk(id, now: now, unit: unit)
        return nil
    }

    /// An in-doubt call waits, without a slot, for its next ask: the backoff after its asks so
    /// far, and never past its reconciliation deadline (the last ask is made then).
    private mutating func waitToAsk(_ id: Int, now: ContinuousClock.Instant, unit: Double) {
        guard let (deadline, asks) = calls[id]?.reconciling else { return }
        let due = min(now.advanced(by: reconcile.interval(after: asks, unit: unit)), deadline)
        calls[id]!.reconciling = (deadline, asks + 1)
        calls[id]!.phase = .waiting(until: due, next: calls[id]!.attempt + 1, holdsSlot: false)
        idleCount += 1
        timers.schedule(id, at: due)
    }

    private mutating func end(_ id: Int, _ settlement: Settlement) -> Action {
        let call = calls[id]!
        drop(id)
        return .settle(call.item, settlement, attempts: call.attempt)
    }

    /// Removes call `id`, keeping the counts.
    private mutating func drop(_ id: Int) {
        guard let call = calls.removeValue(forKey: id) else { return }
        if !call.phase.holdsSlot { idleCount -= 1 }
        if call.reconciling != nil { inDoubtCount -= 1 }
    }

    /// Cancels attempts past their timeout and journals the attempts that are due (retries,
    /// asks of calls in doubt, takeovers whose hold ended). An ask or a takeover's call goes
    /// ahead of the calls waiting for a slot: at most one per request in doubt or recovered, so
    /// neither starves under load (the bound may be passed by that many).
    mutating func tick(now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = []
        // Entries of attempts that already ended are dropped as they reach the front, so the
        // queue holds about the attempts in flight.
        while let first = deadlines.first,
            first.deadline <= now
                || calls[first.call].map({ $0.attempt != first.attempt || $0.phase != .running }) ?? true
        {
            _ = deadlines.popFirst()
            guard let call = calls[first.call], call.attempt == first.attempt, call.phase == .running else { continue }
            calls[first.call]!.phase = .cancelling(.timedOut)
            actions.append(.cancel(call: first.call, call.item))
        }
        for id in timers.popDue(now: now) {
            guard let call = calls[id], case .waiting(_, let next, let holdsSlot) = call.phase else { continue }
            if !holdsSlot { idleCount -= 1 }
            calls[id]!.phase = .journaling(attempt: next)
            calls[id]!.intentAt = now
            actions.append(.journal(call: id, call.item, attempt: next))
        }
        return actions
    }

    /// The intent of call `id`'s next attempt will not become durable (its transaction failed,
    /// its partition is gone): the call is dropped, its record left to the next owner.
    mutating func intentLost(_ id: Int) -> Action? {
        guard let call = calls[id], case .journaling = call.phase else { return nil }
        drop(id)
        return .abandon(call.item)
    }

    /// Partitions are being handed over by `deadline`: a retry that cannot end by then, and every
    /// wait without a slot (an in-doubt request, a takeover's hold), are dropped: their records
    /// are left to the next owner, which reads the journal. Running calls go on.
    mutating func handOver(
        where isLeaving: (InputPartition) -> Bool, by deadline: ContinuousClock.Instant
    ) -> [Action] {
        let timeout = self.timeout
        return abandon { call in
            guard case .waiting(let due, _, let holdsSlot) = call.phase, isLeaving(call.partition) else { return false }
            return !holdsSlot || due.advanced(by: timeout) > deadline
        }
    }

    /// The hand-over of these partitions is overdue: running calls are cancelled (and waited
    /// for), waiting ones and those journaling dropped.
    mutating func interrupt(where isLeaving: (InputPartition) -> Bool) -> [Action] {
        var actions = abandon { call in
            guard isLeaving(call.partition) else { return false }
            if case .journaling = call.phase { return true }
            return call.phase.isWaiting
        }
        for (id, call) in calls where call.phase == .running && isLeaving(call.partition) {
            calls[id]!.phase = .cancelling(.interrupted)
            actions.append(.cancel(call: id, call.item))
        }
        return actions
    }

    private mutating func abandon(where predicate: (Call) -> Bool) -> [Action] {
        let dropped = calls.filter { predicate($0.value) }
        for id in dropped.keys { drop(id) }
        return dropped.values.map { .abandon($0.item) }
    }
}

extension CallTable.Phase {
    var isCancelling: Bool {
        if case .cancelling = self { return true }
        return false
    }
}

/// How the processor reconciles a request in doubt: it asks billing again (recovery calls with
/// the same idempotency key) with capped exponential backoff and jitter, for `duration` at most.
public struct ReconcilePolicy: Sendable, Hashable {
    /// How long after a request goes in doubt billing is asked (`--reconcile-for`).
    public var duration: Duration
    /// The longest wait between two asks (`--reconcile-max-interval-ms`).
    public var maxInterval: Duration
    /// The wait before the first ask; doubling from there.
    public var initialInterval: Duration
    /// A takeover's hold past an open intent's call timeout: the clocks of two members may differ
    /// by this much (`--clock-skew-margin-ms`).
    public var clockSkewMargin: Duration

    public init(
        duration: Duration = .seconds(72 * 3600), maxInterval: Duration = .seconds(300),
        initialInterval: Duration = .seconds(1), clockSkewMargin: Duration = .seconds(5)
    ) {
        self.duration = duration
        self.maxInterval = maxInterval
        self.initialInterval = initialInterval
        self.clockSkewMargin = clockSkewMargin
    }

    /// How long after its intent was written an attempt may still start: half the clock-skew
    /// margin, at least 100 ms. A next owner that finds the intent open takes the call to be over
    /// by the intent's time plus the call timeout and the margin; an attempt started later than
    /// this could still run when that owner's recovery call does (its intent durable late on a
    /// loaded machine or in a slow transaction, or its call slot long in coming, in a member the
    /// group already replaced). The other half of the margin is left for the two members' clocks
    /// (a margin under 200 ms gives part of it up for the floor).
    var launchAllowance: Duration { max(clockSkewMargin / 2, .milliseconds(100)) }

    /// Whether an attempt whose intent was written at `intentAt` may no longer start at `now`.
    func startsTooLate(intentAt: ContinuousClock.Instant, now: ContinuousClock.Instant) -> Bool {
        now > intentAt.advanced(by: launchAllowance)
    }

    /// When a next owner finding the intent written at `intentAt` open takes its call to be over,
    /// and asks billing itself.
    func callOver(intentAt: ContinuousClock.Instant, callTimeout: Duration) -> ContinuousClock.Instant {
        intentAt.advanced(by: callTimeout + clockSkewMargin)
    }

    /// About how many asks backing off from the initial interval fit in `elapsed`: the
    /// interval doubles with each, so the next wait after that long is about `elapsed`.
    func asks(within elapsed: Duration) -> Int {
        var asks = 0
        var covered = Duration.zero
        while asks < 30, covered + initialInterval * (1 << asks) <= elapsed {
            covered += initialInterval * (1 << asks)
            asks += 1
        }
        return asks
    }

    /// The wait before ask `asks + 1`: uniform in [cap/2, cap], cap doubling from the initial
    /// interval up to the maximum. `unit` is a random value in [0, 1).
    func interval(after asks: Int, unit: Double) -> Duration {
        let cap = min(initialInterval * (1 << min(asks, 30)), maxInterval)
        return cap / 2 + (cap / 2) * unit
    }
}
