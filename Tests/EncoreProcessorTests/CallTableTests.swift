import EncoreEvents
import Testing

@testable import EncoreProcessor

/// The call table with an injected clock: every transition by plain values.
@Suite("Call table: attempts, backoff, timeouts, cancellation")
struct CallTableTests {
    struct Retryable: Error {}
    static let partition = InputPartition.requests(0)
    let start = ContinuousClock.now

    func table(maxAttempts: Int = 3) -> CallTable<String> {
        CallTable(
            timeout: .seconds(10),
            retry: RetryPolicy(maxAttempts: maxAttempts, initialBackoff: .seconds(1), maxBackoff: .seconds(8)))
    }

    func at(_ seconds: Double) -> ContinuousClock.Instant { start.advanced(by: .seconds(seconds)) }

    func launch(_ table: inout CallTable<String>, _ item: String, at now: Double = 0) -> Int {
        guard
            case .launch(let id, let launched, let attempt) = table.start(item, partition: Self.partition, now: at(now))
        else {
            Issue.record("start did not launch")
            return -1
        }
        #expect(launched == item && attempt == 1)
        return id
    }

    /// Ticks at `now` expecting one `.journal` of `attempt`, then reports its intent durable and
    /// expects the launch.
    func relaunch(_ table: inout CallTable<String>, _ id: Int, attempt: Int, at now: Double) -> Bool {
        let actions = table.tick(now: at(now))
        guard actions.count == 1, case .journal(id, _, attempt: attempt) = actions[0] else {
            Issue.record("expected the intent of attempt \(attempt) at \(now) s, got \(actions)")
            return false
        }
        guard
            case .launch(id, _, attempt: attempt)? = table.journaled(
                id, attempt: attempt, now: at(now), handOverDeadline: nil)
        else {
            Issue.record("attempt \(attempt) did not launch once its intent was durable")
            return false
        }
        return true
    }

    @Test(
        "a call past its timeout is cancelled and stays in the table until it returns; then it is tried again once its intent is durable (a recovery); with no attempts left it is in doubt, never failed"
    )
    func timeoutWaitsForTheCall() {
        var table = CallTable<String>(
            timeout: .seconds(10), retry: RetryPolicy(maxAttempts: 2, initialBackoff: .seconds(1)))
        let id = launch(&table, "req-0")
        #expect(table.tick(now: at(9.9)).isEmpty)
        let actions = table.tick(now: at(10))
        guard case .cancel(let cancelled, "req-0")? = actions.first, actions.count == 1 else {
            Issue.record("expected one cancel, got \(actions)")
            return
        }
        #expect(cancelled == id)
        // Still there: its user's lane stays held until the call returns.
        #expect(table.count == 1 && table.tick(now: at(100)).isEmpty)
        // Returned: its effect is unknown, so it is tried again after the backoff, as attempt 2.
        let returned = table.finished(
            id, attempt: 1, .failure(CancellationError()), now: at(101), retryUnit: 0, retryDeadline: { _ in nil })
        #expect(returned == nil && table.count == 1)
        guard relaunch(&table, id, attempt: 2, at: 101.5) else { return }
        _ = table.tick(now: at(111.5))
        let end = table.finished(
            id, attempt: 2, .failure(CancellationError()), now: at(112), retryUnit: 0, retryDeadline: { _ in nil })
        guard case .doubt("req-0", let failure, attempts: 2)? = end else {
            Issue.record("expected the request in doubt, got \(String(describing: end))")
            return
        }
        #expect(failure.type == "timeout")
        // In doubt it holds no call slot, but stays in the table: it is asked again.
        #expect(table.count == 0 && table.inDoubtCount == 1 && !table.isEmpty)
    }

    /// A call of "req-0" launched at 0 s, timed out at 10 s and returned at 11 s: the intent of its
    /// attempt 2 is written at 12 s, after the 1 s backoff. Its id.
    func retryJournaledAt12(_ table: inout CallTable<String>) -> Int? {
        let id = launch(&table, "req-0")
        _ = table.tick(now: at(10))
        _ = table.finished(
            id, attempt: 1, .failure(CancellationError()), now: at(11), retryUnit: 0, retryDeadline: { _ in nil })
        let journal = table.tick(now: at(12))
        guard journal.count == 1, case .journal(id, _, attempt: 2) = journal[0] else {
            Issue.record("expected the intent of attempt 2, got \(journal)")
            return nil
        }
        return id
    }

    @Test(
        "an attempt whose intent became durable past half the skew margin is not launched: it waits out a next owner's hold, then asks as the next attempt"
    )
    func lateIntentWaitsOutTheHold() {
        // Timeout 10 s, skew margin 5 s: an attempt launches at most 2.5 s after its intent.
        var table = table()
        // The retry's intent is written at 12 s ...
        guard let id = retryJournaledAt12(&table) else { return }
        // ... and durable at 15 s: a next owner finding it open would ask billing from 12 + 10 + 5 = 27 s,
        // while this attempt, launched now, could run until 25 s. It is not launched.
        let late = table.journaled(id, attempt: 2, now: at(15), handOverDeadline: nil)
        guard case .wait("req-0")? = late else {
            Issue.record("a late intent's attempt was launched: \(String(describing: late))")
            return
        }
        // It holds no slot while it waits, and asks with the next attempt once the hold is over.
        #expect(table.count == 0 && !table.isEmpty)
        #expect(table.tick(now: at(26.9)).isEmpty)
        guard relaunch(&table, id, attempt: 3, at: 27) else { return }
    }

    @Test("an intent durable within half the skew margin launches at once")
    func timelyIntentLaunches() {
        var table = table()
        guard let id = retryJournaledAt12(&table) else { return }
        let launched = table.journaled(id, attempt: 2, now: at(14.5), handOverDeadline: nil)
        guard case .launch(id, "req-0", attempt: 2)? = launched else {
            Issue.record("expected attempt 2 to launch, got \(String(describing: launched))")
            return
        }
    }

    @Test("an answer that arrives after the timeout's cancellation is what happened: it is the outcome")
    func lateAnswer() {
        var table = table()
        let id = launch(&table, "req-0")
        _ = table.tick(now: at(11))
        let end = table.finished(
            id, attempt: 1, .success(.purchased), now: at(12), retryUnit: 0, retryDeadline: { _ in nil })
        guard case .settle("req-0", .answered(.purchased), attempts: 1)? = end else {
            Issue.record("expected purchased, got \(String(describing: end))")
            return
        }
    }

    @Test(
        "a retryable error backs off, then journals and launches the next attempt when due; a final error settles at once"
    )
    func retries() {
        var table = table()
        let id = launch(&table, "req-0")
        let error = PurchaseControllerError.retryable("http_503", "unavailable")
        // unit 0: the backoff is half the cap (1 s), so 0.5 s.
        #expect(
            table.finished(id, attempt: 1, .failure(error), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
                == nil)
        #expect(table.tick(now: at(1.4)).isEmpty)
        guard relaunch(&table, id, attempt: 2, at: 1.5) else { return }
        // A result of the earlier attempt is stale.
        #expect(
            table.finished(id, attempt: 1, .success(.purchased), now: at(2), retryUnit: 0, retryDeadline: { _ in nil })
                == nil)
        let final = PurchaseControllerError.final("declined", "card declined")
        guard
            case .settle(_, .failed(let failure), attempts: 2)? = table.finished(
                id, attempt: 2, .failure(final), now: at(2), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("a final error did not settle")
            return
        }
        #expect(failure.type == "declined" && !failure.retryable)
    }

    @Test("a controller that declines (PurchaseNotAttempted) settles at once as not attempted, never retried")
    func notAttempted() {
        var table = table()
        let id = launch(&table, "req-0")
        let declined = PurchaseNotAttempted(type: "no_recorded_outcome", message: "nothing recorded")
        guard
            case .settle("req-0", .notAttempted(let reason), attempts: 1)? = table.finished(
                id, attempt: 1, .failure(declined), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("a declined call did not settle as not attempted")
            return
        }
        #expect(reason.type == "no_recorded_outcome" && reason.message == "nothing recorded")
        #expect(table.count == 0 && table.tick(now: at(100)).isEmpty)
    }

    @Test("a waiting retry that cannot end before the hand-over is dropped and never fires")
    func retryDroppedOnHandOver() {
        var table = table()
        let id = launch(&table, "req-0")
        let error = PurchaseControllerError.retryable("http_503", "unavailable")
        _ = table.finished(id, attempt: 1, .failure(error), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
        // Due at 1.5 s, it would end by 11.5 s; the hand-over must be over by 5 s.
        let actions = table.handOver(where: { $0 == Self.partition }, by: at(5))
        guard case .abandon("req-0")? = actions.first, actions.count == 1 else {
            Issue.record("expected the retry to be dropped, got \(actions)")
            return
        }
        #expect(table.isEmpty && table.tick(now: at(60)).isEmpty)
    }

    @Test("a retry during a hand-over is dropped when it would end past the deadline, kept when it fits")
    func retryDuringHandOver() {
        var table = table()
        let id = launch(&table, "req-0")
        let error = PurchaseControllerError.retryable("http_503", "unavailable")
        guard
            case .abandon? = table.finished(
                id, attempt: 1, .failure(error), now: at(1), retryUnit: 0, retryDeadline: { _ in at(5) })
        else {
            Issue.record("a retry past the deadline was kept")
            return
        }
        let other = launch(&table, "req-1")
        #expect(
            table.finished(other, attempt: 1, .failure(error), now: at(1), retryUnit: 0, retryDeadline: { _ in at(30) })
                == nil)
        #expect(table.count == 1)
    }

    @Test("an overdue hand-over cancels running calls and waits; a failure then leaves the record to the next owner")
    func interrupt() {
        var table = table()
        let id = launch(&table, "req-0")
        let actions = table.interrupt(where: { $0 == Self.partition })
        guard case .cancel(id, "req-0")? = actions.first, actions.count == 1 else {
            Issue.record("expected a cancel, got \(actions)")
            return
        }
        #expect(table.count == 1)
        guard
            case .abandon("req-0")? = table.finished(
                id, attempt: 1, .failure(CancellationError()), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("an interrupted call that failed was not abandoned")
            return
        }
        #expect(table.isEmpty)
    }

    // MARK: In doubt

    func inDoubtTable(maxAttempts: Int = 2) -> CallTable<String> {
        CallTable(
            timeout: .seconds(10), retry: RetryPolicy(maxAttempts: maxAttempts, initialBackoff: .seconds(1)),
            reconcile: ReconcilePolicy(
                duration: .seconds(100), maxInterval: .seconds(8), initialInterval: .seconds(2),
                clockSkewMargin: .seconds(1)))
    }

    /// Launches `item` and lets every attempt fail with `error` until it is in doubt; returns its id.
    func intoDoubt(_ table: inout CallTable<String>, _ item: String, error: any Error) -> Int? {
        let id = launch(&table, item)
        var now = 1.0
        for attempt in 1...table.retry.maxAttempts {
            let action = table.finished(
                id, attempt: attempt, .failure(error), now: at(now), retryUnit: 0, retryDeadline: { _ in nil })
            if attempt == table.retry.maxAttempts {
                guard case .doubt(item, _, attempts: attempt)? = action else {
                    Issue.record(
                        "expected \(item) in doubt after \(attempt) attempts, got \(String(describing: action))")
                    return nil
                }
                return id
            }
            #expect(action == nil, "attempt \(attempt) is retried")
            now += 1
            guard relaunch(&table, id, attempt: attempt + 1, at: now) else { return nil }
        }
        return nil
    }

    @Test(
        "a 5xx (billing may have acted) on every attempt: in doubt, then asked again with doubling waits up to the cap, each ask journaled first, until billing answers"
    )
    func reconciledWhenBillingAnswers() {
        var table = inDoubtTable()
        let unknown = PurchaseControllerError.outcomeUnknown("http_503", "unavailable")
        guard let id = intoDoubt(&table, "req-0", error: unknown) else { return }
        // In doubt at 2 s, the first ask after 1 s (half the initial 2 s: unit 0); then waits at
        // the cap's top (unit 0.999) doubling to 4 and 8 s, never past 8 s.
        var now = 2.0
        var attempt = 2
        for wait in [1.0, 4.0, 8.0, 8.0] {
            #expect(table.tick(now: at(now + wait - 0.1)).isEmpty, "no ask before the wait is over")
            now += wait
            attempt += 1
            guard relaunch(&table, id, attempt: attempt, at: now) else { return }
            #expect(table.count == 1, "an ask holds a slot while it runs")
            let again = table.finished(
                id, attempt: attempt, .failure(unknown), now: at(now), retryUnit: 0.999, retryDeadline: { _ in nil })
            #expect(again == nil && table.count == 0 && table.inDoubtCount == 1)
        }
        now += 8
        attempt += 1
        guard relaunch(&table, id, attempt: attempt, at: now) else { return }
        let answered = table.finished(
            id, attempt: attempt, .success(.purchased), now: at(now), retryUnit: 0, retryDeadline: { _ in nil })
        guard case .settle("req-0", .answered(.purchased), attempts: attempt)? = answered else {
            Issue.record("billing's answer did not settle the request: \(String(describing: answered))")
            return
        }
        #expect(table.isEmpty && table.inDoubtCount == 0)
    }

    @Test("an ask that times out, or cannot reach billing, only waits for the next ask; a 4xx answer is definite")
    func asksOnlyEndOnADefiniteAnswer() {
        var table = inDoubtTable()
        guard let id = intoDoubt(&table, "req-0", error: PurchaseControllerError.outcomeUnknown("connection", "lost"))
        else { return }
        guard relaunch(&table, id, attempt: 3, at: 3) else { return }
        #expect(table.tick(now: at(13)).count == 1, "the ask timed out: cancelled")
        #expect(
            table.finished(
                id, attempt: 3, .failure(CancellationError()), now: at(13), retryUnit: 0, retryDeadline: { _ in nil })
                == nil)
        guard relaunch(&table, id, attempt: 4, at: 15) else { return }
        #expect(
            table.finished(
                id, attempt: 4, .failure(PurchaseControllerError.retryable("connection", "refused")), now: at(15),
                retryUnit: 0, retryDeadline: { _ in nil }) == nil, "a call that never left: still in doubt")
        guard relaunch(&table, id, attempt: 5, at: 19) else { return }
        let declined = table.finished(
            id, attempt: 5, .failure(PurchaseControllerError.final("http_404", "no such purchase")), now: at(19),
            retryUnit: 0, retryDeadline: { _ in nil })
        guard case .settle("req-0", .failed(let failure), attempts: 5)? = declined else {
            Issue.record("a 4xx did not settle: \(String(describing: declined))")
            return
        }
        #expect(failure.type == "http_404" && table.isEmpty)
    }

    @Test("past the reconciliation time an ask without a definite answer expires: in_doubt_expired, never a result")
    func expires() {
        var table = inDoubtTable()
        let unknown = PurchaseControllerError.outcomeUnknown("http_502", "bad gateway")
        guard let id = intoDoubt(&table, "req-0", error: unknown) else { return }
        // In doubt at 2 s until 102 s; asks every 8 s at most, the last one at the deadline.
        var now = 2.0
        var attempt = 2
        var expiry: CallTable<String>.Action? = nil
        while expiry == nil && now < 200 {
            let actions = table.tick(now: at(now))
            if case .journal(id, _, let next)? = actions.first {
                attempt = next
                _ = table.journaled(id, attempt: next, now: at(now), handOverDeadline: nil)
                expiry = table.finished(
                    id, attempt: attempt, .failure(unknown), now: at(now), retryUnit: 0.999, retryDeadline: { _ in nil }
                )
            }
            now += 0.5
        }
        guard case .settle("req-0", .expired(let failure), attempts: attempt)? = expiry else {
            Issue.record("expected the expiry, got \(String(describing: expiry))")
            return
        }
        #expect(now - 0.5 >= 102 && now - 0.5 <= 102.5, "the last ask is at the deadline")
        #expect(failure.type == "in_doubt_expired" && failure.message.contains("http_502"))
        #expect(table.isEmpty && table.inDoubtCount == 0)
    }

    @Test(
        "the last attempt's error is known not to have reached billing: failed, unless an earlier attempt's effect was unknown"
    )
    func definiteOnlyWhenNoAttemptMayHaveActed() {
        var table = inDoubtTable()
        let refused = PurchaseControllerError.retryable("connection", "refused")
        let id = launch(&table, "req-0")
        #expect(
            table.finished(id, attempt: 1, .failure(refused), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
                == nil)
        guard relaunch(&table, id, attempt: 2, at: 2) else { return }
        guard
            case .settle("req-0", .failed(let failure), attempts: 2)? = table.finished(
                id, attempt: 2, .failure(refused), now: at(2), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("no attempt reached billing: expected failed")
            return
        }
        #expect(failure.type == "connection")

        let other = launch(&table, "req-1")
        _ = table.tick(now: at(10))
        #expect(
            table.finished(
                other, attempt: 1, .failure(CancellationError()), now: at(10), retryUnit: 0, retryDeadline: { _ in nil }
            )
                == nil)
        guard relaunch(&table, other, attempt: 2, at: 11) else { return }
        guard
            case .doubt("req-1", _, attempts: 2)? = table.finished(
                other, attempt: 2, .failure(refused), now: at(11), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("the first attempt timed out (it may have charged): expected in doubt")
            return
        }
    }

    @Test(
        "a takeover's hold: no call and no slot until it ends, then the attempt's intent is written before it launches"
    )
    func takeoverHold() {
        var table = inDoubtTable()
        guard
            case .wait("req-0") = table.start(
                "req-0", partition: Self.partition, attempt: 2, now: at(0), journalAfter: at(16))
        else {
            Issue.record("a held recovery launched")
            return
        }
        #expect(table.count == 0 && !table.isEmpty)
        #expect(table.tick(now: at(15.9)).isEmpty)
        guard let id = table.calls.keys.first, relaunch(&table, id, attempt: 2, at: 16) else { return }
        #expect(table.count == 1)
        // A recovery that runs out of attempts on an unknown effect is in doubt even past the maximum.
        _ = table.tick(now: at(26))
        guard
            case .doubt("req-0", _, attempts: 2)? = table.finished(
                id, attempt: 2, .failure(CancellationError()), now: at(27), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("expected in doubt")
            return
        }
    }

    @Test("a request journaled in doubt is reconciled on start: an unknown answer waits for the next ask")
    func restartedInDoubt() {
        var table = inDoubtTable()
        guard
            case .journal(let id, "req-0", attempt: 4) = table.start(
                "req-0", partition: Self.partition, attempt: 4, now: at(0), journalAfter: at(0), inDoubtUntil: at(50))
        else {
            Issue.record("expected the intent first")
            return
        }
        #expect(table.inDoubtCount == 1)
        _ = table.journaled(id, attempt: 4, now: at(0), handOverDeadline: nil)
        #expect(
            table.finished(
                id, attempt: 4, .failure(PurchaseControllerError.outcomeUnknown("http_500", "down")), now: at(1),
                retryUnit: 0, retryDeadline: { _ in nil }) == nil)
        #expect(table.count == 0 && table.inDoubtCount == 1)
    }

    @Test("a hand-over drops calls in doubt and held takeovers at once: the next owner reads the journal")
    func handOverDropsWaits() {
        var table = inDoubtTable()
        guard intoDoubt(&table, "req-0", error: PurchaseControllerError.outcomeUnknown("http_500", "down")) != nil
        else { return }
        _ = table.start("req-1", partition: Self.partition, attempt: 2, now: at(2), journalAfter: at(30))
        let actions = table.handOver(where: { $0 == Self.partition }, by: at(1000))
        #expect(actions.count == 2 && table.isEmpty && table.inDoubtCount == 0)
    }

    @Test(
        "an attempt whose intent is durable only once its partition's hand-over is near is left to the next owner; an overdue hand-over drops one still journaling"
    )
    func journalingAndHandOver() {
        var table = inDoubtTable()
        let id = launch(&table, "req-0")
        #expect(
            table.finished(
                id, attempt: 1, .failure(PurchaseControllerError.outcomeUnknown("http_503", "down")), now: at(1),
                retryUnit: 0, retryDeadline: { _ in nil }) == nil)
        guard case .journal(id, _, attempt: 2)? = table.tick(now: at(2)).first else {
            Issue.record("expected the retry's intent")
            return
        }
        // The intent lands with 5 s left before the hand-over; the call may take 10.
        guard case .abandon("req-0")? = table.journaled(id, attempt: 2, now: at(3), handOverDeadline: at(8)) else {
            Issue.record("a call that cannot end before the hand-over was launched")
            return
        }
        #expect(table.isEmpty)
        guard
            case .journal(let other, "req-1", attempt: 2) = table.start(
                "req-1", partition: Self.partition, attempt: 2, now: at(3), journalAfter: at(3))
        else {
            Issue.record("expected the recovery's intent")
            return
        }
        guard case .abandon("req-1")? = table.interrupt(where: { $0 == Self.partition }).first else {
            Issue.record("an overdue hand-over kept a call journaling")
            return
        }
        #expect(table.journaled(other, attempt: 2, now: at(4), handOverDeadline: nil) == nil && table.isEmpty)
    }

    @Test(
        "attempts used up with an unknown effect while the partition is handed over: left to the next owner, not in doubt here"
    )
    func unknownDuringHandOver() {
        var table = inDoubtTable(maxAttempts: 1)
        let id = launch(&table, "req-0")
        guard
            case .abandon("req-0")? = table.finished(
                id, attempt: 1, .failure(PurchaseControllerError.outcomeUnknown("http_503", "down")), now: at(1),
                retryUnit: 0, retryDeadline: { _ in at(30) })
        else {
            Issue.record("expected the record left to the next owner")
            return
        }
        #expect(table.isEmpty && table.inDoubtCount == 0)
    }

    @Test("an error that says the effect is unknown is never a definite failure, even when it says not retryable")
    func unknownWinsOverFinal() {
        var table = inDoubtTable(maxAttempts: 1)
        let id = launch(&table, "req-0")
        let unknown = PurchaseControllerError(
            type: "store_timeout", message: "the store did not answer", isRetryable: false, isOutcomeUnknown: true)
        guard
            case .doubt("req-0", let failure, attempts: 1)? = table.finished(
                id, attempt: 1, .failure(unknown), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
        else {
            Issue.record("an unknown effect ended otherwise than in doubt")
            return
        }
        #expect(failure.type == "store_timeout")
    }

    @Test("an attempt whose intent will never be durable leaves the table once, as an abandoned record")
    func intentLost() {
        var table = inDoubtTable()
        guard
            case .journal(let id, "req-0", attempt: 2) = table.start(
                "req-0", partition: Self.partition, attempt: 2, now: at(0), journalAfter: at(0))
        else {
            Issue.record("expected the intent first")
            return
        }
        guard case .abandon("req-0")? = table.intentLost(id) else {
            Issue.record("expected the record left to the next owner")
            return
        }
        #expect(table.intentLost(id) == nil && table.interrupt(where: { _ in true }).isEmpty && table.isEmpty)
    }

    @Test("a request in doubt for a while before a restart goes on asking at the interval it had reached")
    func asksResumeTheirBackoff() {
        let policy = ReconcilePolicy(maxInterval: .seconds(300), initialInterval: .seconds(1))
        // 1 + 2 + 4 + 8 = 15 s: four asks; 16 s not yet a fifth.
        #expect(policy.asks(within: .zero) == 0 && policy.asks(within: .seconds(15)) == 4)
        #expect(policy.asks(within: .seconds(30)) == 4 && policy.asks(within: .seconds(31)) == 5)
        // After ten hours the cap: every ask 150 to 300 s apart.
        let late = policy.interval(after: policy.asks(within: .seconds(36_000)), unit: 0)
        #expect(late == .seconds(150))
    }
}
