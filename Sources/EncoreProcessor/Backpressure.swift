import Synchronization

/// Pauses the consumer when too many records are held and resumes it once half of them are done.
struct Backpressure {
    enum Action: Equatable {
        case pause, resume
    }

    let capacity: Int
    private(set) var isPaused = false

    init(capacity: Int) {
        self.capacity = capacity
    }

    /// The action to take now that `held` records are held, if any.
    mutating func update(held: Int) -> Action? {
        if !isPaused && held >= capacity {
            isPaused = true
            return .pause
        }
        if isPaused && held <= capacity / 2 {
            isPaused = false
            return .resume
        }
        return nil
    }
}

/// The count of records held, shared by the task that reads the consumer (it admits records) and
/// the loop (it releases them when done). Pausing and resuming happen under the same lock as the
/// decision, so a late pause can never undo an earlier resume.
final class FlowControl: Sendable {
    private struct State {
        var backpressure: Backpressure
        var held = 0
    }

    private let state: Mutex<State>
    /// Pauses (`true`) or resumes (`false`) every assigned partition.
    private let setPaused: @Sendable (Bool) -> Void

    init(capacity: Int, setPaused: @escaping @Sendable (Bool) -> Void) {
        state = Mutex(State(backpressure: Backpressure(capacity: capacity)))
        self.setPaused = setPaused
    }

    /// `count` records entered the processor.
    func admit(_ count: Int) { change(by: count) }

    /// `count` records are done (finished, or left to the partition's next owner).
    func release(_ count: Int) { change(by: -count) }

    var isPaused: Bool { state.withLock { $0.backpressure.isPaused } }

    var held: Int { state.withLock { $0.held } }

    /// Runs `pause` for newly assigned partitions when the consumer is paused, under the lock.
    func whilePaused(_ pause: () -> Void) {
        state.withLock { if $0.backpressure.isPaused { pause() } }
    }

    private func change(by delta: Int) {
        guard delta != 0 else { return }
        state.withLock { state in
            state.held += delta
            switch state.backpressure.update(held: state.held) {
            case .pause?: setPaused(true)
            case .resume?: setPaused(false)
            case nil: break
            }
        }
    }
}
