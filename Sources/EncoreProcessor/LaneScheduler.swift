/// Decides which work items may start: one at a time per lane (user), in arrival order, and at
/// most `maxInFlight` across lanes. Lanes waiting for a slot are served round-robin.
///
/// A pure state machine: the processor feeds it arrivals and completions and starts the items it
/// returns.
struct LaneScheduler<Item, LaneKey: Hashable> {
    private struct Lane {
        var queue = FIFO<Item>()
        var isRunning = false
        var isWaitingForSlot = false
    }

    let maxInFlight: Int
    private var lanes: [LaneKey: Lane] = [:]
    private var waiting = FIFO<LaneKey>()
    private(set) var inFlight = 0
    /// Items held: waiting in a lane or running.
    private(set) var count = 0

    init(maxInFlight: Int) {
        precondition(maxInFlight > 0)
        self.maxInFlight = maxInFlight
    }

    /// Adds `item` at the end of `lane`; returns the items to start now (at most one).
    mutating func enqueue(_ item: Item, lane key: LaneKey) -> Item? {
        count += 1
        // Lanes are mutated in place: copying one out would copy its queue.
        if lanes[key] != nil {
            lanes[key]!.queue.append(item)
            return nil
        }
        if inFlight < maxInFlight {
            inFlight += 1
            lanes[key] = Lane(isRunning: true)
            return item
        }
        var lane = Lane(isWaitingForSlot: true)
        lane.queue.append(item)
        lanes[key] = lane
        waiting.append(key)
        return nil
    }

    /// The running item of `lane` finished; returns the item to start now, if any (the one slot
    /// freed starts at most one lane).
    mutating func finish(lane key: LaneKey) -> Item? {
        precondition(lanes[key]?.isRunning == true, "finish(lane:) for a lane with nothing running")
        inFlight -= 1
        count -= 1
        if lanes[key]!.queue.isEmpty {
            lanes[key] = nil
        } else {
            lanes[key]!.isRunning = false
            lanes[key]!.isWaitingForSlot = true
            waiting.append(key)
        }
        return startNextWaiting()
    }

    /// Removes items not yet started that match `predicate`; returns them.
    mutating func removeWaiting(where predicate: (Item) -> Bool) -> [Item] {
        var removed: [Item] = []
        for key in Array(lanes.keys) {
            let taken = lanes[key]!.queue.removeAll(where: predicate)
            guard !taken.isEmpty else { continue }
            removed += taken
            if lanes[key]!.queue.isEmpty {
                if lanes[key]!.isRunning {
                    lanes[key]!.isWaitingForSlot = false
                } else {
                    lanes[key] = nil
                }
            }
        }
        count -= removed.count
        return removed
    }

    private mutating func startNextWaiting() -> Item? {
        guard inFlight < maxInFlight else { return nil }
        while let key = waiting.popFirst() {
            // A lane emptied by removeWaiting may still be listed here.
            guard lanes[key]?.isWaitingForSlot == true, let item = lanes[key]!.queue.popFirst() else { continue }
            lanes[key]!.isWaitingForSlot = false
            lanes[key]!.isRunning = true
            inFlight += 1
            return item
        }
        return nil
    }
}

/// A string with its hash computed once: request ids are looked up twice per request, and a probe
/// compares the stored hashes before any bytes.
struct HashedString: Hashable, Sendable {
    let value: String
    private let hashCode: Int

    init(_ value: String) {
        self.value = value
        hashCode = value.hashValue
    }

    func hash(into hasher: inout Hasher) { hasher.combine(hashCode) }

    static func == (lhs: HashedString, rhs: HashedString) -> Bool {
        lhs.hashCode == rhs.hashCode && lhs.value == rhs.value
    }
}

/// A user's lane: `{app_id}:{app_user_id}` without building that string, hash computed once.
struct UserLane: Hashable, Sendable {
    let appID: String
    let appUserID: String
    private let hashCode: Int

    init(appID: String, appUserID: String) {
        self.appID = appID
        self.appUserID = appUserID
        var hasher = Hasher()
        hasher.combine(appID)
        hasher.combine(appUserID)
        hashCode = hasher.finalize()
    }

    func hash(into hasher: inout Hasher) { hasher.combine(hashCode) }

    static func == (lhs: UserLane, rhs: UserLane) -> Bool {
        lhs.hashCode == rhs.hashCode && lhs.appUserID == rhs.appUserID && lhs.appID == rhs.appID
    }
}
