import Dispatch
import Synchronization

/// Bounds the records a ``KafkaConsumer`` has handed out and the application has not yet
/// released: while `capacity` are held, the consumer stops polling.
///
/// Not polling leaves what librdkafka prefetched in its queue (bounded by
/// `queued.max.messages.kbytes`); pausing partitions instead would discard that queue and fetch
/// it again on resume. If the buffer stays full for ``stallLimit`` (calls that hang), the consumer
/// pauses its partitions and polls on, so rebalances are still served, and resumes them once
/// there is room.
public final class KafkaAdmission: Sendable {
    public let capacity: Int
    /// How long the consumer waits for room without polling before it pauses instead.
    public let stallLimit: Duration

    private struct State {
        var held = 0
        var isWaiting = false
        var fullSince: ContinuousClock.Instant? = nil
        /// Partitions the consumer paused because the buffer stayed full.
        var pausedForRoom: [KafkaTopicPartition]? = nil
    }

    private let state = Mutex(State())
    private let room = DispatchSemaphore(value: 0)

    public init(capacity: Int, stallLimit: Duration = .seconds(1)) {
        precondition(capacity > 0, "an admission needs a positive capacity")
        self.capacity = capacity
        self.stallLimit = stallLimit
    }

    /// Records handed out and not yet released.
    public var held: Int { state.withLock { $0.held } }

    /// The consumer paused its partitions because the buffer stayed full past ``stallLimit``.
    public var isPausedForRoom: Bool { state.withLock { $0.pausedForRoom != nil } }

    /// `count` records entered. The consumer counts what it hands out itself; this is for records
    /// that reach the application another way (tests feeding records by hand).
    public func admit(_ count: Int) {
        state.withLock { $0.held += count }
    }

    /// `count` records are done with (processed, or dropped to be read again by another owner).
    public func release(_ count: Int) {
        guard count != 0 else { return }
        let wake = state.withLock { state -> Bool in
            state.held -= count
            guard state.isWaiting, state.held < capacity else { return false }
            state.isWaiting = false
            return true
        }
        if wake { room.signal() }
    }

    enum Decision {
        /// Poll for up to `room` records (with the partitions paused for room, one poll serves callbacks).
        case poll(room: Int)
        /// Poll, after resuming these partitions paused for room.
        case resumeAndPoll([KafkaTopicPartition], room: Int)
        /// The buffer stayed full for the stall limit: pause the assignment, then poll.
        case pauseAndPoll
        /// Still full: ask again.
        case wait
    }

    /// What the poll thread does next; waits up to `slice` for room first when the buffer is full.
    func decide(slice: Duration) -> Decision {
        if let decision = decideNow() { return decision }
        _ = room.wait(timeout: .now() + .milliseconds(slice.milliseconds))
        return decideNow() ?? .wait
    }

    private func decideNow() -> Decision? {
        state.withLock { state -> Decision? in
            if state.held < capacity {
                state.isWaiting = false
                state.fullSince = nil
                if let paused = state.pausedForRoom {
                    state.pausedForRoom = nil
                    return .resumeAndPoll(paused, room: capacity - state.held)
                }
                return .poll(room: capacity - state.held)
            }
            if state.pausedForRoom != nil { return .poll(room: 1) }
            let now = ContinuousClock.now
            let since = state.fullSince ?? now
            state.fullSince = since
            if since.duration(to: now) >= stallLimit { return .pauseAndPoll }
            state.isWaiting = true
            return nil
        }
    }

    /// Records the partitions paused because the buffer stayed full (resumed when there is room).
    func pausedForRoom(_ partitions: [KafkaTopicPartition]) {
        state.withLock { $0.pausedForRoom = partitions }
    }
}
