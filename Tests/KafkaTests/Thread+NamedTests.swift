import Foundation
import Testing

@testable import Kafka

@Suite("Thread.startNamed: threads operators can tell apart")
struct NamedThreadTests {
    @Test(
        "the kernel knows the thread by its name from its first instruction on",
        .enabled(if: FileManager.default.fileExists(atPath: "/proc/thread-self/comm")), .timeLimit(.minutes(1)),
        arguments: ["encore.test", "encore.fifteen1"])
    func named(name: String) async {
        // (Awaited, not waited for with a semaphore: a test blocking one of the shared pool's two
        // threads held up every other test for as long as it waited.)
        let seen = await withCheckedContinuation { (continuation: CheckedContinuation<String, Never>) in
            Thread.startNamed(name) {
                let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "unreadable"
                continuation.resume(returning: comm.trimmingCharacters(in: .newlines))
            }
        }
        #expect(seen == name)
    }
}
