import EncoreEvents
import Kafka
import Testing

@testable import EncoreProcessor

/// The worker as a pure state machine: inputs in with the time, actions out, no executor, no
/// thread and no clock. Each step names the one action it must decide.
@Suite("Worker: inputs and time in, actions out")
struct WorkerTests {
    static let topic = "encore.purchase-requests"

    /// A worker at a fixed time, with one controller routed for every product.
    struct Driven {
        var worker: Worker
        var now: ContinuousClock.Instant
        var nowMs: Int64 = 1_764_475_700_000

        init(transactional: Bool = false, configure: (inout ProcessorConfiguration) -> Void = { _ in }) {
            var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
            configure(&configuration)
            now = ContinuousClock.now
            var router = PurchaseRouter()
            router.register("simulated", SimulatedController(weights: [(.purchased, 1)], allowsProduction: true))
            router.route(.any, to: "simulated")
            worker = Worker(
                configuration: configuration, router: router, transactional: transactional, now: now, nowMs: nowMs,
                seed: 7,
                logsDebug: false)
        }

        /// Handles `inputs` as one batch `elapsed` after the last; returns what they decided.
        mutating func step(_ inputs: ProcessorInput..., after elapsed: Duration = .zero) -> [WorkerAction] {
            step(inputs, after: elapsed)
        }

        mutating func step(_ inputs: [ProcessorInput], after elapsed: Duration = .zero) -> [WorkerAction] {
            now = now.advanced(by: elapsed)
            nowMs += Int64(elapsed.milliseconds)
            var decided: [WorkerAction] = []
            var taken: [WorkerAction] = []
            for input in inputs {
                worker.handle(input, now: now, nowMs: nowMs)
                worker.takeActions(into: &taken)
                decided += taken
            }
            worker.endBatch(now: now, nowMs: nowMs)
            worker.takeActions(into: &taken)
            return decided + taken
        }
    }

    static func record(_ event: PurchaseRequestEvent, offset: Int64) -> ProcessorInput {
        .records([incoming(event, offset: offset)])
    }

    static func incoming(_ event: PurchaseRequestEvent, offset: Int64) -> IncomingRecord {
        IncomingRecord(
            message: KafkaMessage(
                topic: topic, partition: 0, offset: offset, key: Array(event.key.utf8), value: event.jsonBytes(),
                headers: []))
    }

    /// One batch of `count` records at offsets 0..., request `i` of user `u<i>`.
    static func usersRecords(_ count: Int) -> ProcessorInput {
        .records((0..<count).map { incoming(request($0, user: "u\($0)"), offset: Int64($0)) })
    }

    /// One call slot, users u0 and u1 each with a request, both intents acknowledged: u0's call
    /// started, u1 waits for the slot. The worker and u0's call.
    static func oneSlotTwoUsers(
        _ configure: (inout ProcessorConfiguration) -> Void
    ) throws -> (Driven, (id: Int, attempt: Int, request: PurchaseRequest)) {
        var driven = Driven {
            $0.maxInFlight = 1
            configure(&$0)
        }
        _ = driven.step(assignment())
        let intents = produced(driven.step(usersRecords(2)))
        #expect(intents.count == 2)
        let first = try #require(calls(driven.step(acknowledged(intents))).first)
        #expect(first.request.appUserId == "u0")
        return (driven, first)
    }

    /// The journal records among `outputs` of request `requestID`.
    static func journaled(_ outputs: [(token: UInt, output: UnsentOutput)], requestID: String) -> [(
        token: UInt, output: UnsentOutput
    )] {
        outputs.filter {
            if case .journal(let entry, _) = $0.output { entry.entry.requestID == requestID } else { false }
        }
    }

    static func assignment() -> ProcessorInput {
        .assigned([KafkaTopicPartition(topic: topic, partition: 0)], finished: [:], restored: [:], committed: [:])
    }

    /// The outputs of the one `.produce` among `actions`, and the tokens to acknowledge them.
    static func produced(_ actions: [WorkerAction]) -> [(token: UInt, output: UnsentOutput)] {
        let batches = actions.compactMap { action -> [(token: UInt, output: UnsentOutput)]? in
            if case .produce(let outputs) = action { outputs } else { nil }
        }
        #expect(batches.count == 1, "the batch's outputs in one hand-off")
        return batches.first ?? []
    }

    /// The outputs of every `.produce` among `actions` (none, one or several hand-offs).
    static func producedOutputs(_ actions: [WorkerAction]) -> [(token: UInt, output: UnsentOutput)] {
        actions.flatMap { action -> [(token: UInt, output: UnsentOutput)] in
            if case .produce(let outputs) = action { outputs } else { [] }
        }
    }

    static func acknowledged(_ outputs: [(token: UInt, output: UnsentOutput)]) -> ProcessorInput {
        .delivered(outputs.map { KafkaDelivery(token: $0.token, error: nil, record: nil) })
    }

    static func calls(_ actions: [WorkerAction]) -> [(id: Int, attempt: Int, request: PurchaseRequest)] {
        actions.compactMap { action in
            if case .call(let id, let attempt, let request, _) = action { (id, attempt, request) } else { nil }
        }
    }

    @Test(
        "a granting result and the user's next intent share one changelog write: its state record holds the grant"
    )
    func sharedWriteKeepsTheGrant() throws {
        var driven = Driven()
        _ = driven.step(Self.assignment())
        var first = request(1, user: "u1")
        first.entitlement = Entitlement(type: .freeTrial, value: 7, unit: .days)
        // The second waits behind the first; it repeats the same grant, which changes nothing.
        var actions = driven.step(
            .records([Self.incoming(first, offset: 0), Self.incoming(request(2, user: "u1"), offset: 1)]))
        // Each produce batch's state records and journal records (request id, result or open).
        var batches: [(states: [EntitlementStateRecord], journal: [String])] = []
        var called: [String] = []
        for _ in 0..<12 {
            let produced = Self.producedOutputs(actions)
            let calls = Self.calls(actions)
            called += calls.map(\.request.requestId)
            if produced.isEmpty && calls.isEmpty { break }
            var batch: (states: [EntitlementStateRecord], journal: [String]) = ([], [])
            for (_, output) in produced {
                switch output {
                case .state(let state, _): batch.states.append(state)
                case .journal(let record, _):
                    batch.journal.append("\(record.entry.requestID) \(record.entry.result?.rawValue ?? "open")")
                default: break
                }
            }
            if !batch.states.isEmpty || !batch.journal.isEmpty { batches.append(batch) }
            var inputs = calls.map {
                ProcessorInput.attemptFinished(call: $0.id, attempt: $0.attempt, .success(.purchased))
            }
            if !produced.isEmpty { inputs.append(Self.acknowledged(produced)) }
            actions = driven.step(inputs, after: .milliseconds(1))
        }
        let (id1, id2) = (first.requestID, request(2, user: "u1").requestID)
        #expect(called == [id1, id2], "each request called once, in order")
        // Request 1's intent; its grant's state alone; then, once the state is durable, its result
        // and request 2's intent in the same write; request 2's result (no state: nothing changed).
        #expect(
            batches.map(\.journal) == [["\(id1) open"], [], ["\(id1) purchased", "\(id2) open"], ["\(id2) purchased"]])
        let states = batches.flatMap(\.states)
        #expect(states.count == 1, "one state record: request 2 granted nothing new")
        #expect(states.first?.grants.map(\.requestID) == [id1], "the shared write's state holds request 1's grant")
        #expect(states.first?.sequence == 1)
    }

    @Test("a request: intent out, call once it is acknowledged, outcome, then its offset committed")
    func oneRequest() throws {
        var driven = Driven()
        _ = driven.step(Self.assignment())
        let event = request(1, user: "u1")

        // The record decides the intent only: the call waits until it is durable.
        let intake = driven.step(Self.record(event, offset: 0))
        #expect(Self.calls(intake).isEmpty)
        let intent = Self.produced(intake)
        #expect(intent.count == 1)
        guard case .journal(let entry, partition: 0) = intent.first?.output else {
            Issue.record("expected the request's intent, got \(intent.map(\.output))")
            return
        }
        #expect(entry.entry.requestID == event.requestID && entry.entry.attempts == 1 && entry.entry.result == nil)

        // Acknowledged: the call starts, attempt 1, not a recovery.
        let called = Self.calls(driven.step(Self.acknowledged(intent)))
        #expect(called.count == 1)
        let call = try #require(called.first)
        #expect(call.attempt == 1 && call.request.requestId == event.requestID && !call.request.isRecovery)

        // Billing answered: the outcome goes out (with the result's journal record after it).
        let answered = driven.step(.attemptFinished(call: call.id, attempt: 1, .success(.purchased)))
        let outputs = Self.produced(answered)
        let outcomes = outputs.compactMap { output -> PurchaseOutcomeEvent? in
            if case .outcome(let outcome, _) = output.output { outcome } else { nil }
        }
        #expect(outcomes.map(\.requestID) == [event.requestID] && outcomes.first?.result == .purchased)

        // Every output acknowledged (and what follows them): the record is done and released.
        var pending = outputs
        var released = 0
        for _ in 0..<4 where !pending.isEmpty {
            let next = driven.step(Self.acknowledged(pending))
            released += next.reduce(0) { sum, action in
                if case .release(let count) = action { sum + count } else { sum }
            }
            pending = next.flatMap { action -> [(token: UInt, output: UnsentOutput)] in
                if case .produce(let outputs) = action { outputs } else { [] }
            }
        }
        #expect(pending.isEmpty && released == 1)

        // The commit interval passes: offset 1 of partition 0 is committed, once.
        let ticked = driven.step(.tick, after: .milliseconds(250))
        let commits = ticked.compactMap { action -> [(InputPartition, KafkaTopicPartitionOffset)]? in
            if case .commit(let changed) = action { changed } else { nil }
        }
        #expect(commits.count == 1 && commits.first?.map(\.1.offset) == [1])
        #expect(
            driven.step(.tick, after: .milliseconds(250)).allSatisfy { if case .commit = $0 { false } else { true } },
            "no second commit while the first is in flight")
        // The broker refused it: the next interval commits the same offset again, once.
        let again = driven.step(.commitFinished(landed: [:], failed: true), .tick, after: .milliseconds(250))
        let retried = again.compactMap { action -> [(InputPartition, KafkaTopicPartitionOffset)]? in
            if case .commit(let changed) = action { changed } else { nil }
        }
        #expect(retried.count == 1 && retried.first?.map(\.1.offset) == [1])
        #expect(driven.worker.statistics.commitFailures == 1)
        // Accepted: nothing changed since, nothing to commit.
        let accepted = driven.step(
            .commitFinished(landed: [.requests(0): try #require(retried.first?.first?.1)]), .tick,
            after: .milliseconds(250))
        #expect(accepted.allSatisfy { if case .commit = $0 { false } else { true } })
    }

    @Test(
        "an intent acknowledged past half the skew margin makes no first call: a recovery call once a next owner's hold is over"
    )
    func lateIntentIsAskedAsARecovery() throws {
        // Call timeout 1 s, skew margin 5 s (the defaults' margin): a first call starts at most
        // 2.5 s after its intent was written.
        var driven = Driven { $0.callTimeout = .seconds(1) }
        _ = driven.step(Self.assignment())
        let event = request(1, user: "u1")
        let intent = Self.produced(driven.step(Self.record(event, offset: 0)))
        // Durable 3 s later (a loaded machine, a slow transaction): a next owner finding the intent
        // open asks billing from its time + 1 + 5 s; this call could run until 3 + 1 s. Not made.
        let late = driven.step(Self.acknowledged(intent), after: .seconds(3))
        #expect(Self.calls(late).isEmpty, "a first call started past the takeover's assumption: \(Self.calls(late))")
        // The hold is over 6 s after the intent: billing is asked, as attempt 2, a recovery call,
        // once that attempt's intent is durable.
        #expect(Self.calls(driven.step(.tick, after: .milliseconds(2_900))).isEmpty)
        let due = driven.step(.tick, after: .milliseconds(200))
        let recoveryIntent = Self.produced(due)
        guard case .journal(let entry, partition: 0)? = recoveryIntent.first?.output else {
            Issue.record("expected the intent of attempt 2, got \(recoveryIntent.map(\.output))")
            return
        }
        #expect(entry.entry.attempts == 2 && entry.entry.result == nil)
        let called = Self.calls(driven.step(Self.acknowledged(recoveryIntent)))
        let call = try #require(called.first)
        #expect(called.count == 1 && call.attempt == 2 && call.request.isRecovery)
        #expect(driven.worker.statistics.lateIntents == LateIntents(held: 1, rewritten: 0))
    }

    @Test(
        "a first call whose slot comes past half the skew margin after its intent writes the intent again, and starts once that one is durable"
    )
    func lateSlotRewritesTheIntent() throws {
        // Both durable at once; one slot: u0 is called, u1 waits for the slot.
        var (driven, first) = try Self.oneSlotTwoUsers { $0.callTimeout = .seconds(10) }
        // The slot comes 3 s after u1's intent: a next owner takes a call to start within 2.5 s of
        // its intent. u1's intent is written again (attempt 1: nothing was called) ...
        let freed = driven.step(.attemptFinished(call: first.id, attempt: 1, .success(.purchased)), after: .seconds(3))
        #expect(Self.calls(freed).isEmpty, "a first call started 3 s after its intent: \(Self.calls(freed))")
        let rewritten = Self.journaled(Self.produced(freed), requestID: "req-1")
        guard rewritten.count == 1, case .journal(let entry, partition: 0) = rewritten[0].output else {
            Issue.record("expected u1's intent written again, got \(Self.produced(freed).map(\.output))")
            return
        }
        #expect(entry.entry.attempts == 1 && entry.entry.result == nil)
        // ... and its call, a first call, starts once that intent is durable.
        let called = Self.calls(driven.step(Self.acknowledged(rewritten)))
        let call = try #require(called.first)
        #expect(called.count == 1 && call.attempt == 1 && !call.request.isRecovery && call.request.appUserId == "u1")
        #expect(driven.worker.statistics.lateIntents == LateIntents(held: 0, rewritten: 1))
    }

    @Test(
        "a retry whose intent is acknowledged late waits out a next owner's hold without its slot: a request waiting for the slot gets it at once"
    )
    func lateRetryFreesItsSlot() throws {
        var (driven, first) = try Self.oneSlotTwoUsers {
            $0.callTimeout = .seconds(1)
            $0.retry = RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(10), maxBackoff: .milliseconds(10))
        }
        // u0's call times out and returns; its retry's intent is written after the backoff ...
        _ = driven.step(.tick, after: .milliseconds(1_100))
        _ = driven.step(.attemptFinished(call: first.id, attempt: 1, .failure(CancellationError())))
        let retryIntent = Self.produced(driven.step(.tick, after: .milliseconds(20)))
        guard case .journal(let entry, _)? = retryIntent.first?.output, entry.entry.attempts == 2 else {
            Issue.record("expected the intent of u0's attempt 2, got \(retryIntent.map(\.output))")
            return
        }
        // ... and acknowledged 3 s later: not launched, and its slot goes to u1, whose own intent is
        // as old by now and is written again first.
        let late = driven.step(Self.acknowledged(retryIntent), after: .seconds(3))
        #expect(Self.calls(late).isEmpty)
        let rewritten = Self.journaled(Self.produced(late), requestID: "req-1")
        #expect(rewritten.count == 1, "u1 waited on for a slot no call held: \(Self.produced(late).map(\.output))")
        #expect(driven.worker.statistics.lateIntents == LateIntents(held: 1, rewritten: 1))
    }

    @Test("intents go out at most eight call bounds ahead of the calls: a crash leaves few users held at takeover")
    func intentsStayNearTheCalls() throws {
        var driven = Driven { $0.maxInFlight = 2 }
        _ = driven.step(Self.assignment())
        // 40 users' requests in one batch, with calls that do not answer.
        func intents(_ outputs: [(token: UInt, output: UnsentOutput)]) -> Int {
            outputs.filter { if case .journal(let entry, _) = $0.output { entry.entry.result == nil } else { false } }
                .count
        }
        // Each intent is an open intent a restart must hold its user for (until the call could be
        // over): journaled for 16 (8 x 2) requests ahead, not for all 40.
        let first = Self.produced(driven.step(Self.usersRecords(40)))
        #expect(intents(first) == 16)
        // Acknowledged: 2 calls start (the bound), and 2 more intents take their place ahead.
        let started = driven.step(Self.acknowledged(first))
        #expect(Self.calls(started).count == 2)
        #expect(intents(Self.produced(started)) == 2)
        // A call answered: its slot goes to an acknowledged intent, whose place ahead goes to one more.
        let call = try #require(Self.calls(started).first)
        let answered = driven.step(.attemptFinished(call: call.id, attempt: 1, .success(.purchased)))
        #expect(Self.calls(answered).count == 1)
        #expect(intents(Self.produced(answered)) == 1)
    }

    @Test("a call past its timeout is cancelled on the tick that finds it, not before")
    func timeout() throws {
        var driven = Driven { $0.callTimeout = .seconds(2) }
        _ = driven.step(Self.assignment())
        let intent = Self.produced(driven.step(Self.record(request(1, user: "u1"), offset: 0)))
        let call = try #require(Self.calls(driven.step(Self.acknowledged(intent))).first)
        let cancels = { (actions: [WorkerAction]) in
            actions.compactMap { action -> Int? in if case .cancelCall(let id) = action { id } else { nil } }
        }
        #expect(cancels(driven.step(.tick, after: .milliseconds(1_900))).isEmpty)
        #expect(cancels(driven.step(.tick, after: .milliseconds(200))) == [call.id])
    }

    @Test(
        "exactly-once, the loop ended: an open transaction is aborted unless the commit in flight committed it; a refused one fails the worker",
        arguments: [0, 1, 2])
    func endTransaction(commitInFlight: Int) {
        var driven = Driven(transactional: true)
        let refused = KafkaError(code: .invalidConfiguration, message: "the transaction must be aborted")
        let commit: KafkaError?? = [nil, .some(nil), .some(refused)][commitInFlight]
        let aborts = driven.worker.endTransaction(commit: commit)
        #expect(aborts == (commitInFlight != 1))
        #expect((driven.worker.failure?.code == .outputLost) == (commitInFlight == 2))
        let again = driven.worker.endTransaction(commit: nil)
        #expect(!again, "closed: nothing is left to abort")
    }

    @Test(
        "dead-letter warnings past 10 a second are counted in a line of their own once the second is over, with no later dead letter to carry it"
    )
    func leftOutDeadLetterWarningsAreSaid() {
        var driven = Driven()
        _ = driven.step(Self.assignment())
        let invalid = (0..<15).map { offset in
            IncomingRecord(
                message: KafkaMessage(
                    topic: Self.topic, partition: 0, offset: Int64(offset), key: Array("app:user".utf8),
                    value: Array("not json".utf8), headers: []))
        }
        let logs = { (actions: [WorkerAction]) -> [String] in
            actions.compactMap { if case .log(_, let message, _) = $0 { message } else { nil } }
        }
        let first = logs(driven.step(.records(invalid)))
        #expect(first.filter { $0 == "dead letter" }.count == 10, "at most 10 warnings a second: \(first)")
        #expect(!first.contains { $0.contains("more dead letters") }, "the second is not over yet")
        let later = logs(driven.step(.tick, after: .milliseconds(1_100)))
        #expect(
            later.filter { $0.hasPrefix("5 more dead letters") }.count == 1,
            "the 5 left out are said on the tick after the second ends: \(later)")
        let quiet = logs(driven.step(.tick, after: .milliseconds(1_100)))
        #expect(!quiet.contains { $0.contains("more dead letters") }, "said once: \(quiet)")
    }
}
