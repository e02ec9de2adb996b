import EncoreEvents
import Kafka
import Testing

@testable import EncoreProcessor

@Suite("Output tracker: record completion, redelivery in order, fatal errors")
struct OutputTrackerTests {
    let start = ContinuousClock.now
    static let partition = InputPartition.requests(0)

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start.advanced(by: .milliseconds(milliseconds)) }

    func ref(_ offset: Int64) -> RecordRef { RecordRef(partition: Self.partition, offset: offset, generation: 1) }

    func outcome(_ index: Int, user: String) -> UnsentOutput {
        .outcome(
            PurchaseOutcomeEvent(
                request: request(index, user: user), result: .purchased, attempts: 1, completedAtMs: 1, controller: "c",
                error: nil))
    }

    func failure(_ code: KafkaError.Code) -> KafkaError { KafkaError(code: code, message: "test") }

    func record(_ index: Int, user: String) -> KafkaProducerRecord {
        guard case .outcome(let event, _) = outcome(index, user: user) else { fatalError() }
        return KafkaProducerRecord(topic: "outcomes", key: Array(event.key.utf8), value: event.jsonBytes())
    }

    func done(_ events: [OutputTracker<String>.Event]) -> [String?] {
        events.compactMap { if case .recordDone(_, let item) = $0 { item } else { nil } }
    }

    func update(user: String, sequences: [Int64]) -> LedgerUpdate {
        LedgerUpdate(
            changes: sequences.map {
                EntitlementChangeEvent(
                    appID: "app", appUserID: user, change: .granted,
                    entitlement: Entitlement(type: .freeTrial, value: 7, unit: .days), status: .verified,
                    isActive: true, effectiveAtMs: 1, sequence: $0)
            },
            state: EntitlementStateRecord(appID: "app", appUserID: user, sequence: sequences.last ?? 0),
            partition: 0)
    }

    /// The sequences of change events handed out, in order (`0` for anything else).
    func sequences(_ unsent: [(token: UInt, output: UnsentOutput)]) -> [Int64] {
        unsent.map { entry in
            switch entry.output {
            case .change(let change, _): change.sequence
            case .record(let record): (try? EntitlementChangeEvent(jsonBytes: record.value))?.sequence ?? -1
            default: 0
            }
        }
    }

    func changeRecord(_ unsent: (token: UInt, output: UnsentOutput)) -> KafkaProducerRecord {
        guard case .change(let change, _) = unsent.output else { fatalError("not a change") }
        return KafkaProducerRecord(topic: "changes", key: Array(change.key.utf8), value: change.jsonBytes())
    }

    func acknowledge(_ sent: [(token: UInt, output: UnsentOutput)], in tracker: inout OutputTracker<String>)
        -> [OutputTracker<String>.Event]
    {
        tracker.delivered(sent.map { KafkaDelivery(token: $0.token, error: nil, record: nil) }, now: at(0))
    }

    func states(_ sent: [(token: UInt, output: UnsentOutput)]) -> [Int64] {
        sent.compactMap { if case .state(let state, _) = $0.output { state.sequence } else { nil } }
    }

    @Test(
        "a shared record writes the state of the last update that changed it, never an intent's that holds the user's identity only"
    )
    func sharedRecordTakesTheChangedState() {
        var tracker = OutputTracker<String>()
        tracker.publish(
            update(user: "u", sequences: [3]), for: ref(0), item: "req-0",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"))], result: "req-0")
        _ = acknowledge(tracker.takeUnsent(), in: &tracker)
        // The next request's intent, as the worker's ledger makes it: the journal alone, no state.
        let entry = EntitlementStateRecord.RequestEntry(requestID: "req-1", attempts: 1, startedAtMs: 2)
        let intent = LedgerUpdate(
            changes: [], state: EntitlementStateRecord(appID: "app", appUserID: "u"), partition: 0, key: "app:u",
            writesState: false, journal: JournalRecord(appID: "app", appUserID: "u", seq: 1, entry: entry),
            holdsState: false)
        tracker.publish(intent, for: nil, intent: "req-1")
        let written = tracker.takeUnsent()
        #expect(states(written) == [3], "the granting result's state, not the intent's empty one")
        var events = acknowledge(written, in: &tracker)
        let journal = tracker.takeUnsent()
        #expect(journal.count == 1 && states(journal).isEmpty, "the intent's journal record, once the state is durable")
        events += acknowledge(journal, in: &tracker)
        #expect(done(events) == ["req-0"])
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["req-1"])
        #expect(!tracker.hasStateUpdates && tracker.pendingRecords == 0)
    }

    @Test("an acknowledged result and the user's next intent share one changelog record, acknowledged for both")
    func readyUpdatesShareARecord() {
        var tracker = OutputTracker<String>()
        tracker.publish(
            update(user: "u", sequences: [1]), for: ref(0), item: "req-0",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"))], result: "req-0")
        let first = tracker.takeUnsent()
        #expect(first.count == 2 && states(first).isEmpty, "the outcome and the change go first")
        var events = acknowledge(first, in: &tracker)
        let ready = events.compactMap { if case .resultReady(let item) = $0 { item } else { nil } }
        #expect(ready == ["req-0"] && done(events).isEmpty)
        // The result's record waits to be written: a drain must not take the tracker for idle.
        #expect(!tracker.isIdle && tracker.hasUnsent)
        // The loop starts the user's next request: its intent (a later state of the user).
        var intent = update(user: "u", sequences: [])
        intent.state.sequence = 5
        tracker.publish(intent, for: nil, intent: "req-1")
        let written = tracker.takeUnsent()
        #expect(states(written) == [5], "one record: the latest state holds the result and the intent")
        events = acknowledge(written, in: &tracker)
        #expect(done(events) == ["req-0"])
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["req-1"])
        #expect(!tracker.hasStateUpdates && tracker.pendingRecords == 0)
        // Without a next request, the result is written alone, once its outputs are acknowledged.
        tracker.publish(
            update(user: "v", sequences: []), for: ref(2), item: "req-2",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(2, user: "v"))], result: "req-2")
        events = acknowledge(tracker.takeUnsent(), in: &tracker)
        #expect(events.contains { if case .resultReady("req-2") = $0 { true } else { false } })
        let alone = tracker.takeUnsent()
        #expect(alone.count == 1 && states(alone) == [0])
        #expect(done(acknowledge(alone, in: &tracker)) == ["req-2"])
    }

    func journaled(_ seq: Int64, _ id: String, result: OutcomeResult?) -> JournalRecord {
        JournalRecord(
            appID: "app", appUserID: "u", seq: seq,
            entry: .init(
                requestID: id, attempts: 1, startedAtMs: 1, result: result, completedAtMs: result.map { _ in 2 }))
    }

    func journal(_ sent: [(token: UInt, output: UnsentOutput)]) -> [String] {
        sent.map { entry in
            switch entry.output {
            case .journal(let record, _): "\(record.entry.requestID):\(record.entry.result?.rawValue ?? "intent")"
            case .state(let state, _): "state \(state.sequence)"
            default: "other"
            }
        }
    }

    @Test(
        "journal v2: a result that changed the state writes the state alone, its journal records once it is acknowledged (after a redelivery too); done when all are"
    )
    func stateThenJournalRecord() {
        var tracker = OutputTracker<String>()
        var result = update(user: "u", sequences: [3])
        result.journal = journaled(0, "req-0", result: .purchased)
        tracker.publish(
            result, for: ref(0), item: "req-0",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"))], result: "req-0")
        _ = acknowledge(tracker.takeUnsent(), in: &tracker)
        // The next request's intent is ready at once: one write, the state first.
        // (The intent's state is the result's here, as the public ledger methods make it; the
        // worker's carries the identity alone, and the write takes the result's state either way.)
        var intent = update(user: "u", sequences: [3])
        intent.changes = []
        intent.writesState = false
        intent.journal = journaled(1, "req-1", result: nil)
        tracker.publish(intent, for: nil, intent: "req-1")
        let stateOnly = tracker.takeUnsent()
        #expect(journal(stateOnly) == ["state 3"], "the state alone first")
        // The state record fails and is produced again: the journal records still wait for it.
        var events = tracker.delivered(
            [
                KafkaDelivery(
                    token: stateOnly[0].token, error: failure(.messageTimedOut),
                    record: KafkaProducerRecord(topic: "encore.entitlement-state", key: nil, value: []))
            ], now: at(0))
        #expect(events.contains { if case .redelivering = $0 { true } else { false } })
        #expect(journal(tracker.takeUnsent()).isEmpty)
        tracker.tick(now: at(600))
        let redelivered = tracker.takeUnsent()
        #expect(redelivered.count == 1)
        events = acknowledge(redelivered, in: &tracker)
        #expect(done(events).isEmpty, "the result's journal record is not written yet")
        // Acknowledged: now the journal records that claim it.
        let written = tracker.takeUnsent()
        #expect(journal(written) == ["req-0:purchased", "req-1:intent"])
        // The result acknowledged, not yet the intent: nothing finishes.
        events = acknowledge(Array(written.prefix(1)), in: &tracker)
        #expect(done(events).isEmpty && !events.contains { if case .intentWritten = $0 { true } else { false } })
        events = acknowledge(Array(written.suffix(1)), in: &tracker)
        #expect(done(events) == ["req-0"])
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["req-1"])
        #expect(!tracker.hasStateUpdates && tracker.pendingRecords == 0)
        // Two records of one slot ready together write the last only, and finish both updates.
        var settled = update(user: "u", sequences: [])
        settled.writesState = false
        settled.journal = journaled(2, "req-2", result: .failed)
        tracker.publish(
            settled, for: ref(2), item: "req-2",
            alongside: [(.outcome(.failed, requestedAtMs: 0), outcome(2, user: "u"))])
        var again = settled
        again.journal!.entry.attempts = 2
        tracker.publish(again, for: nil, intent: "b")
        let outcomeOnly = tracker.takeUnsent()
        #expect(journal(outcomeOnly) == ["other"], "the records wait for the outcome")
        events = acknowledge(outcomeOnly, in: &tracker)
        let both = tracker.takeUnsent()
        #expect(journal(both) == ["req-2:failed"])
        guard case .journal(let record, _) = both.first?.output else { return }
        #expect(record.entry.attempts == 2)
        events = acknowledge(both, in: &tracker)
        #expect(done(events) == ["req-2"])
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["b"])
    }

    @Test("without shared records (exactly-once) each ready update is written alone, at once")
    func unsharedRecords() {
        var tracker = OutputTracker<String>(sharesRecords: false)
        tracker.publish(
            update(user: "u", sequences: []), for: ref(0), item: "req-0",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"))])
        _ = acknowledge(tracker.takeUnsent(), in: &tracker)
        var intent = update(user: "u", sequences: [])
        intent.state.sequence = 5
        tracker.publish(intent, for: nil, intent: "req-1")
        let first = tracker.takeUnsent()
        #expect(states(first) == [0], "the result's record alone")
        #expect(done(acknowledge(first, in: &tracker)) == ["req-0"])
        let second = tracker.takeUnsent()
        #expect(states(second) == [5])
        let events = acknowledge(second, in: &tracker)
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["req-1"])
    }

    @Test("a shared changelog record that fails is produced again; then it finishes each of its updates once")
    func sharedRecordRedelivered() {
        var tracker = OutputTracker<String>(redeliveryDelay: .milliseconds(500))
        tracker.publish(
            update(user: "u", sequences: []), for: ref(0), item: "req-0",
            alongside: [(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"))], result: "req-0")
        _ = acknowledge(tracker.takeUnsent(), in: &tracker)
        var intent = update(user: "u", sequences: [])
        intent.state.sequence = 5
        tracker.publish(intent, for: nil, intent: "req-1")
        let written = tracker.takeUnsent()
        #expect(states(written) == [5])
        // An expiry of the user while that record is in flight waits for it: one record at a time.
        var expiry = update(user: "u", sequences: [])
        expiry.state.sequence = 6
        tracker.publish(expiry, for: nil)
        let record = KafkaProducerRecord(topic: "state", key: Array("app:u".utf8), value: [])
        var events = tracker.delivered(
            [KafkaDelivery(token: written[0].token, error: failure(.messageTimedOut), record: record)], now: at(0))
        #expect(done(events).isEmpty && !events.contains { if case .intentWritten = $0 { true } else { false } })
        tracker.tick(now: at(600))
        let again = tracker.takeUnsent()
        #expect(again.count == 1 && again[0].token == written[0].token)
        events = acknowledge(again, in: &tracker)
        #expect(done(events) == ["req-0"])
        #expect(events.compactMap { if case .intentWritten(let item) = $0 { item } else { nil } } == ["req-1"])
        let last = tracker.takeUnsent()
        #expect(states(last) == [6])
        _ = acknowledge(last, in: &tracker)
        // (Idle once the outputs were taken again: the acknowledgement may have made a record ready.)
        #expect(tracker.takeUnsent().isEmpty && tracker.isIdle && !tracker.hasStateUpdates)
    }

    @Test("one change event of a user in flight at a time: a failed one is produced again before the user's next")
    func redeliveryKeepsOrder() {
        var tracker = OutputTracker<String>(redeliveryDelay: .milliseconds(500))
        tracker.publish(update(user: "u", sequences: [1, 2]), for: ref(0), item: "req-0")
        tracker.publish(update(user: "v", sequences: [1]), for: ref(1), item: "req-1")
        // u's second change waits behind its first; v's goes.
        let first = tracker.takeUnsent()
        #expect(sequences(first) == [1, 1])
        var events = tracker.delivered(
            [KafkaDelivery(token: first[0].token, error: failure(.messageTimedOut), record: changeRecord(first[0]))],
            now: at(0))
        guard case .redelivering? = events.first else {
            Issue.record("a timed-out delivery was not redelivered: \(events)")
            return
        }
        // A later update of u (an expiry, a source event) waits too.
        tracker.publish(update(user: "u", sequences: [3]), for: nil)
        #expect(!tracker.hasUnsent)
        tracker.tick(now: at(499))
        #expect(!tracker.hasUnsent)
        tracker.tick(now: at(500))
        let again = tracker.takeUnsent()
        #expect(sequences(again) == [1] && again[0].token == first[0].token)
        events = tracker.delivered([KafkaDelivery(token: again[0].token, error: nil, record: nil)], now: at(600))
        let second = tracker.takeUnsent()
        #expect(sequences(second) == [2])
        _ = tracker.delivered([KafkaDelivery(token: second[0].token, error: nil, record: nil)], now: at(700))
        // Both changes acknowledged: the changelog record of the first update, then the next change.
        let next = tracker.takeUnsent()
        #expect(next.count == 2 && sequences(next).contains(3))
        #expect(!tracker.isIdle)
    }

    @Test("a token reused after a redelivery does not carry the record produced again to its next output")
    func reusedTokenForgetsRedelivery() {
        var tracker = OutputTracker<String>(redeliveryDelay: .milliseconds(500))
        tracker.send(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"), for: ref(0), item: "req-0")
        let first = tracker.takeUnsent()
        _ = tracker.delivered(
            [KafkaDelivery(token: first[0].token, error: failure(.messageTimedOut), record: record(0, user: "u"))],
            now: at(0))
        tracker.tick(now: at(500))
        let again = tracker.takeUnsent()
        guard case .record(let redelivered)? = again.first?.output else {
            Issue.record("the timed-out outcome was not produced again: \(again)")
            return
        }
        #expect(again[0].token == first[0].token && redelivered.value == record(0, user: "u").value)
        #expect(done(acknowledge(again, in: &tracker)) == ["req-0"])
        // The freed token goes to the next output; its failure comes back without the record (a
        // producer that cannot give it back): nothing of the earlier output's record is produced.
        tracker.send(.outcome(.purchased, requestedAtMs: 0), outcome(1, user: "v"), for: ref(1), item: "req-1")
        let next = tracker.takeUnsent()
        #expect(next.count == 1 && next[0].token == first[0].token)
        let events = tracker.delivered(
            [KafkaDelivery(token: next[0].token, error: failure(.messageTimedOut), record: nil)], now: at(600))
        tracker.tick(now: at(2_000))
        let producedAgain = tracker.takeUnsent().count
        #expect(producedAgain == 0, "the earlier output's record was produced again as the next one's")
        guard case .fatal? = events.first, events.count == 1 else {
            Issue.record("a failure with no record to produce again was not fatal: \(events)")
            return
        }
    }

    @Test(
        "a missing topic, a refused authorization or a record too large is fatal: no redelivery, the record never finishes",
        arguments: [
            KafkaError.Code.unknownTopicOrPartition, KafkaError.Code(rawValue: 29),  // TOPIC_AUTHORIZATION_FAILED
            KafkaError.Code(rawValue: 10),  // MSG_SIZE_TOO_LARGE
        ])
    func fatal(code: KafkaError.Code) {
        var tracker = OutputTracker<String>()
        tracker.send(.outcome(.purchased, requestedAtMs: 0), outcome(0, user: "u"), for: ref(0), item: "req-0")
        let sent = tracker.takeUnsent()
        let events = tracker.delivered(
            [KafkaDelivery(token: sent[0].token, error: failure(code), record: record(0, user: "u"))], now: at(0))
        guard case .fatal? = events.first, events.count == 1 else {
            Issue.record("\(code) was not fatal: \(events)")
            return
        }
        tracker.tick(now: at(10_000))
        #expect(!tracker.hasUnsent && tracker.isIdle && tracker.pendingRecords == 1)
    }

    @Test("a record is done once every one of its outputs is acknowledged")
    func recordDone() {
        var tracker = OutputTracker<String>()
        tracker.send(.outcome(.failed, requestedAtMs: 0), outcome(0, user: "u"), for: ref(0), item: "req-0")
        tracker.send(.deadLetter, .deadLetter(deadLetter(), key: nil), for: ref(0), item: "req-0")
        let sent = tracker.takeUnsent()
        #expect(
            done(tracker.delivered([KafkaDelivery(token: sent[1].token, error: nil, record: nil)], now: at(0))) == [])
        #expect(
            done(tracker.delivered([KafkaDelivery(token: sent[0].token, error: nil, record: nil)], now: at(0))) == [
                "req-0"
            ])
        #expect(tracker.isIdle && tracker.pendingRecords == 0)
    }

    func deadLetter() -> DeadLetterEvent {
        DeadLetterEvent(
            topic: "t", partition: 0, offset: 0, key: nil, value: [], headers: [],
            error: .init(stage: .controller, errorClass: "x", message: "x", retryable: false), attempts: 1,
            failedAtMs: 0, requestID: nil)
    }
}
