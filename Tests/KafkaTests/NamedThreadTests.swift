import Foundation
import Synchronization
import Testing

@testable import Kafka

@Suite("Thread.startNamed: threads operators can tell apart")
struct NamedThreadTests {
    @Test(
        "the kernel knows the thread by its name (the first 15 bytes) from its first instruction on",
        .enabled(if: FileManager.default.fileExists(atPath: "/proc/thread-self/comm")),
        arguments: [("encore.test", "encore.test"), ("encore.a-longer-name", "encore.a-longer")])
    func named(name: String, expected: String) throws {
        let seen = Mutex<String?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.startNamed(name) {
            let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "unreadable"
            seen.withLock { $0 = comm.trimmingCharacters(in: .newlines) }
            done.signal()
        }
        try #require(done.wait(timeout: .now() + 60) == .success, "the thread did not run")
        #expect(seen.withLock { $0 } == expected)
    }
}
