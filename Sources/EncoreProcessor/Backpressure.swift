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
