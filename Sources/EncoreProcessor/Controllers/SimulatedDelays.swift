import Dispatch
import Foundation
import Synchronization

/// Sleeps of the simulated controller, woken in batches by one thread of their own.
///
/// `Task.sleep` arms a dispatch timer per call (a system call and a manager-thread hop each); at
/// thousands of simulated calls in flight that costs more CPU than the processor's own work per
/// request, so a load test would measure the stand-in store rather than the processor. Here every
/// sleeper waits in one deadline heap, and the thread resumes all that are due (within
/// ``resolution``) at once. Cancellation ends a sleep early with `CancellationError`, as
/// `Task.sleep` does.
final class SimulatedDelays: Sendable {
    static let shared = SimulatedDelays()

    /// Sleepers due within this much of each other are woken together.
    static let resolution: Duration = .milliseconds(1)

    private struct State {
        var deadlines = TimerQueue<UInt64, UInt64>()
        var sleepers: [UInt64: UnsafeContinuation<Void, any Error>] = [:]
        var nextID: UInt64 = 0
        /// When the thread plans to wake next (`nil`: when signalled).
        var plannedWake: UInt64? = nil
        var isRunning = false
    }

    private let state = Mutex(State())
    private let wakeUp = DispatchSemaphore(value: 0)

    /// Suspends for `duration`, or until the task is cancelled (then throws `CancellationError`).
    func sleep(for duration: Duration) async throws {
        let nanoseconds =
            UInt64(max(0, duration.components.seconds)) * 1_000_000_000
            + UInt64(max(0, duration.components.attoseconds) / 1_000_000_000)
        let deadline = Self.now() + nanoseconds
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            // Unsafe (no misuse check, no allocation): each continuation leaves `sleepers` exactly once,
            // under the lock, and is resumed by whoever took it out.
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let (signal, start) = state.withLock { state -> (Bool, Bool) in
                    state.sleepers[id] = continuation
                    state.deadlines.schedule(id, at: deadline)
                    let start = !state.isRunning
                    state.isRunning = true
                    guard state.plannedWake.map({ deadline < $0 }) ?? true else { return (false, start) }
                    state.plannedWake = deadline
                    return (true, start)
                }
                if start { startThread() }
                if signal { wakeUp.signal() }
                // Cancelled before the sleeper was registered: the handler found nothing to end.
                if Task.isCancelled { cancel(id) }
            }
        } onCancel: {
            cancel(id)
        }
    }

    private func cancel(_ id: UInt64) {
        // The deadline stays in the heap and is skipped when it comes up.
        let continuation = state.withLock { $0.sleepers.removeValue(forKey: id) }
        continuation?.resume(throwing: CancellationError())
    }

    private func startThread() {
        Thread.startNamed("encore.delays") { [self] in
            while true { wakeDueSleepers() }
        }
    }

    private func wakeDueSleepers() {
        let slack = UInt64(Self.resolution.components.attoseconds / 1_000_000_000)
        let (due, next) = state.withLock { state -> ([UnsafeContinuation<Void, any Error>], UInt64?) in
            let ids = state.deadlines.popDue(now: Self.now() + slack)
            let due = ids.compactMap { state.sleepers.removeValue(forKey: $0) }
            state.plannedWake = state.deadlines.firstDue
            return (due, state.plannedWake)
        }
        for continuation in due { continuation.resume() }
        if let next {
            let now = Self.now()
            guard next > now else { return }
            _ = wakeUp.wait(timeout: .now() + .nanoseconds(Int(min(next - now, 60_000_000_000))))
        } else {
            wakeUp.wait()
        }
    }

    private static func now() -> UInt64 {
        DispatchTime.now().uptimeNanoseconds
    }
}
