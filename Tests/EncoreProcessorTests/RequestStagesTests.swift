import EncoreEvents
import Kafka
import Testing

@testable import EncoreProcessor

/// ``RequestStages``: a request's time in the worker, from its record's arrival to its result
/// durable, split where the worker waits on something else: its user's earlier request, its
/// intent's write, its call and outputs, its result's journal record.
@Suite("Request stages: where a request's time in the worker goes")
struct RequestStagesTests {
    @Test("two requests of one user: each stage's time, summed over both, and the means")
    func twoRequestsOfOneUser() throws {
        var driven = WorkerTests.Driven()
        _ = driven.step(WorkerTests.assignment())
        // Both records arrive at 0 ms; the second waits behind the first (one lane per user).
        var actions = driven.step(
            .records([
                WorkerTests.incoming(request(1, user: "u1"), offset: 0),
                WorkerTests.incoming(request(2, user: "u1"), offset: 1),
            ]))
        // Each round answers what the last decided (outputs acknowledged, calls answered) after
        // 1, 2, 4, ... ms, so every stage's time is a sum of distinct powers of two.
        var at = 0
        var released: [Int] = []
        for round in 0..<10 {
            let produced = WorkerTests.producedOutputs(actions)
            let calls = WorkerTests.calls(actions)
            if produced.isEmpty && calls.isEmpty { break }
            let elapsed = 1 << round
            at += elapsed
            var inputs = calls.map {
                ProcessorInput.attemptFinished(call: $0.id, attempt: $0.attempt, .success(.purchased))
            }
            if !produced.isEmpty { inputs.append(WorkerTests.acknowledged(produced)) }
            actions = driven.step(inputs, after: .milliseconds(elapsed))
            if actions.contains(where: { if case .release = $0 { true } else { false } }) { released.append(at) }
        }
        // The rounds, at 1, 3, 7, 15, 31, 63 and 127 ms: request 1's intent is durable at 1 (its
        // call starts), answered at 3 (its outcome goes out), its outcome acknowledged at 7 (its
        // result's journal record goes out, and request 2 starts: its intent shares that write),
        // both durable at 15 (request 1 done; request 2's call starts), answered at 31, its
        // outcome acknowledged at 63, its result durable at 127.
        #expect(released == [15, 127])
        let stages = driven.worker.statistics.stages
        #expect(stages.count == 2)
        #expect(stages.waitingForUser == .milliseconds(0 + 7))
        #expect(stages.intent == .milliseconds(1 + (15 - 7)))
        #expect(stages.outputs == .milliseconds((7 - 1) + (63 - 15)))
        #expect(stages.resultRecord == .milliseconds((15 - 7) + (127 - 63)))
        #expect(
            stages.meanMilliseconds.map(\.0) == ["waiting_for_user", "intent", "outputs", "result_record"]
                && stages.meanMilliseconds.map(\.1) == [3.5, 4.5, 27, 36])
    }

    @Test("a duplicate finishes without a call: it is not counted")
    func duplicateIsNotCounted() throws {
        var driven = WorkerTests.Driven()
        _ = driven.step(WorkerTests.assignment())
        let event = request(1, user: "u1")
        var actions = driven.step(WorkerTests.record(event, offset: 0))
        for _ in 0..<6 {
            var inputs = WorkerTests.calls(actions).map {
                ProcessorInput.attemptFinished(call: $0.id, attempt: $0.attempt, .success(.purchased))
            }
            let produced = WorkerTests.producedOutputs(actions)
            if !produced.isEmpty { inputs.append(WorkerTests.acknowledged(produced)) }
            if inputs.isEmpty { break }
            actions = driven.step(inputs, after: .milliseconds(1))
        }
        #expect(driven.worker.statistics.stages.count == 1)
        // The same request again: its journal holds the result, so it finishes at once, uncalled.
        _ = driven.step(WorkerTests.record(event, offset: 1))
        #expect(driven.worker.statistics.duplicates == 1)
        #expect(driven.worker.statistics.stages.count == 1)
    }

    @Test("the statistics of two workers add their stages; a request that missed one is left out")
    func combined() {
        let at = ContinuousClock.now
        func ms(_ value: Int) -> ContinuousClock.Instant { at.advanced(by: .milliseconds(value)) }
        var one = ProcessorStatistics()
        var other = ProcessorStatistics()
        /// A request's times; `nil` leaves a stage unstamped.
        func times(_ started: Int, _ intentDurable: Int?, _ outputsAcknowledged: Int) -> RequestTimes {
            var times = RequestTimes(received: ms(0))
            times.start(at: ms(started))
            if let intentDurable { times.intentDurable(at: ms(intentDurable)) }
            times.outputsAcknowledged(at: ms(outputsAcknowledged))
            // A second stamp of a stage is not taken: its first counts.
            times.start(at: ms(started + 100))
            if let intentDurable { times.intentDurable(at: ms(intentDurable + 100)) }
            times.outputsAcknowledged(at: ms(outputsAcknowledged + 100))
            return times
        }
        one.stages.record(times(2, 5, 9), done: ms(14))
        other.stages.record(times(6, 7, 15), done: ms(18))
        other.stages.record(times(1, nil, 3), done: ms(4))
        let total = ProcessorStatistics.combined([one, other]).stages
        #expect(total.count == 2)
        #expect(
            [total.waitingForUser, total.intent, total.outputs, total.resultRecord]
                == [.milliseconds(8), .milliseconds(4), .milliseconds(12), .milliseconds(8)])
        #expect(total.meanMilliseconds.map(\.milliseconds) == [4, 2, 6, 4])
    }
}
