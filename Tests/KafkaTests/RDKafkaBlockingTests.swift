import Foundation
@testable import Kafka
import Synchronization
import Testing

@Suite("Blocking librdkafka calls")
struct RDKafkaBlockingTests {
    /// One slow call (a commit, a flush on a slow broker) must not hold up the others: a queue as
    /// wide as the cores started one more thread a second.
    @Test("blocking calls each get a thread at once: more calls than cores, each waiting for all, all start")
    func callsDoNotWaitForOneAnother() async {
        // Past the cores by more than the 20 s a width-limited queue would take to grow to them.
        let calls = ProcessInfo.processInfo.activeProcessorCount + 30
        let started = StartedCalls()
        let deadline = ContinuousClock.now.advanced(by: .seconds(20))
        let metAll = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<calls {
                group.addTask {
                    (try? await RDKafkaBlocking.run { () throws(KafkaError) -> Bool in
                        started.count.add(1, ordering: .sequentiallyConsistent)
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
        #expect(metAll == calls, "calls that saw all \(calls) start within 20 s of the first")
    }

    private final class StartedCalls: Sendable {
        let count = Atomic(0)
    }
}
