import Foundation
@testable import Kafka
import Synchronization
import Testing

@Suite("Blocking librdkafka calls")
struct RDKafkaBlockingTests {
    /// One slow call (a commit, a flush on a slow broker) must not hold up the others: a queue as
    /// wide as the cores started one more thread a second.
    ///
    /// Timed from the first call's start, not the test's: on a loaded machine the tasks that make
    /// the calls may themselves wait for the cooperative pool (a run beside stress-ng and the whole
    /// suite saw none start within 20 s). A queue that grows a thread a second needs 90 s to start
    /// the calls past the cores; a thread per call, well under the 60 s allowed.
    @Test("blocking calls each get a thread at once: more calls than cores, each waiting for all, all start")
    func callsDoNotWaitForOneAnother() async {
        let calls = ProcessInfo.processInfo.activeProcessorCount + 90
        let started = StartedCalls()
        let metAll = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<calls {
                group.addTask {
                    (try? await RDKafkaBlocking.run { () throws(KafkaError) -> Bool in
                        started.count.add(1, ordering: .sequentiallyConsistent)
                        let deadline = started.deadline(after: .seconds(60))
                        // Blocks its thread, as a librdkafka call does, until every call has started.
                        while ContinuousClock.now < deadline {
                            if started.count.load(ordering: .sequentiallyConsistent) == calls { return true }
                            usleep(1000)
                        }
                        return false
                    }) ?? false
                }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(metAll == calls, "calls that saw all \(calls) start within 60 s of the first")
    }

    /// What a call holds (a client) is let go before the caller goes on: the last reference to a
    /// librdkafka client released on the call's thread destroyed it there, while the caller went
    /// on to exit the process (librdkafka 2.16 then crashed at exit: "double free or corruption",
    /// "corrupted size vs. prev_size", after `topics create` and after a processor stopped).
    @Test("a blocking call lets go of what it captured before its caller resumes")
    func callLetsGoBeforeItsCallerResumes() async throws {
        for round in 0..<200 {
            weak var released: Captured?
            do {
                let captured = Captured()
                released = captured
                try await RDKafkaBlocking.run { () throws(KafkaError) in withExtendedLifetime(captured) {} }
            }
            #expect(released == nil, "round \(round): still held by the call's thread")
            if released != nil { return }
        }
    }

    private final class Captured: Sendable {}

    private final class StartedCalls: Sendable {
        let count = Atomic(0)
        private let first = Mutex<ContinuousClock.Instant?>(nil)

        /// `limit` after the first call started (set by the first to ask).
        func deadline(after limit: Duration) -> ContinuousClock.Instant {
            first.withLock { first in
                let start = first ?? .now
                first = start
                return start.advanced(by: limit)
            }
        }
    }
}
