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

    @Test(
        "a call past its timeout is cancelled and stays in the table until it returns; then it is tried again (a recovery); with no attempts left it fails with timeout"
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
        guard case .launch(id, "req-0", attempt: 2)? = table.tick(now: at(101.5)).first else {
            Issue.record("expected the second attempt")
            return
        }
        _ = table.tick(now: at(111.5))
        let end = table.finished(
            id, attempt: 2, .failure(CancellationError()), now: at(112), retryUnit: 0, retryDeadline: { _ in nil })
        guard case .settle("req-0", .failed(let failure), attempts: 2)? = end else {
            Issue.record("expected a failed settlement, got \(String(describing: end))")
            return
        }
        #expect(failure.type == "timeout" && !failure.retryable)
        #expect(table.isEmpty)
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

    @Test("a retryable error backs off, then launches the next attempt when due; a final error settles at once")
    func retries() {
        var table = table()
        let id = launch(&table, "req-0")
        let error = PurchaseControllerError.retryable("http_503", "unavailable")
        // unit 0: the backoff is half the cap (1 s), so 0.5 s.
        #expect(
            table.finished(id, attempt: 1, .failure(error), now: at(1), retryUnit: 0, retryDeadline: { _ in nil })
                == nil)
        #expect(table.tick(now: at(1.4)).isEmpty)
        guard case .launch(id, "req-0", attempt: 2)? = table.tick(now: at(1.5)).first else {
            Issue.record("the retry was not launched when due")
            return
        }
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
}
