import EncoreEvents
/// Decides which work items may start: one at a time per lane (user), in arrival order, and at
/// most `maxInFlight` calls across lanes. Lanes waiting for a slot are served round-robin.
///
/// A lane's item holds a slot while its call runs, or while it is in doubt (billing is asked
/// again; ``endCall(lane:)`` gives the slot back once it settles), and
/// holds the lane until its outputs are acknowledged (``releaseLane(_:)``): a user's next request
/// starts only after the previous one is answered on the broker, so a user's outputs keep their
/// order even when a delivery is produced again.
///
/// A pure state machine: the processor feeds it arrivals and completions and starts the items it
/// returns.
struct LaneScheduler<Item, LaneKey: Hashable> {
    private enum Phase { case waitingForSlot, running, finishing }

    private struct Lane {
        var queue = FIFO<Item>()
        var phase: Phase
    }

    let maxInFlight: Int
    private var lanes: [LaneKey: Lane] = [:]
    private var waiting = FIFO<LaneKey>()
    /// Items holding a slot (in their call).
    private(set) var inFlight = 0
    /// Items held: waiting in a lane, running or finishing.
    private(set) var count = 0

    init(maxInFlight: Int) {
        precondition(maxInFlight > 0)
        self.maxInFlight = maxInFlight
    }

    /// Adds `item` at the end of `lane`; returns the item to start now, if any.
    mutating func enqueue(_ item: Item, lane key: LaneKey) -> Item? {
        count += 1
        // Lanes are read and mutated in place (``inPlace(_:_:)``): a copy of one copies its queue.
        if let index = lanes.index(forKey: key) {
            lanes.values[index].queue.append(item)
            return nil
        }
        if inFlight < maxInFlight {
            inFlight += 1
            lanes[key] = Lane(phase: .running)
            return item
        }
        var lane = Lane(phase: .waitingForSlot)
        lane.queue.append(item)
        lanes[key] = lane
        waiting.append(key)
        return nil
    }

    /// The running item of `lane` needs its slot no more (its call returned); the lane stays held
    /// until ``releaseLane(_:)``. Returns the item of another lane to start now, if any.
    mutating func endCall(lane key: LaneKey) -> Item? {
        let index = index(ofLane: key, in: .running, "endCall(lane:) for a lane with no running item")
        inFlight -= 1
        lanes.values[index].phase = .finishing
        return startNextWaiting()
    }

    /// The item of `lane` is done with its lane (its outputs acknowledged, or as far as the caller
    /// needs); the lane's next item queues for a slot. Returns the item to start now, if any.
    mutating func releaseLane(_ key: LaneKey) -> Item? {
        let index = index(ofLane: key, in: .finishing, "releaseLane(_:) for a lane whose call has not ended")
        count -= 1
        if inPlace(&lanes.values[index], { $0.queue.isEmpty }) {
            lanes.remove(at: index)
            return nil
        }
        lanes.values[index].phase = .waitingForSlot
        waiting.append(key)
        return startNextWaiting()
    }

    /// The running item of `lane` is done and had no outputs to wait for (a duplicate, an
    /// abandoned call): ``endCall(lane:)`` and ``releaseLane(_:)`` at once. The one slot freed
    /// starts at most one item.
    mutating func finish(lane key: LaneKey) -> Item? {
        let index = index(ofLane: key, in: .running, "finish(lane:) for a lane with no running item")
        inFlight -= 1
        count -= 1
        if inPlace(&lanes.values[index], { $0.queue.isEmpty }) {
            lanes.remove(at: index)
        } else {
            lanes.values[index].phase = .waitingForSlot
            waiting.append(key)
        }
        return startNextWaiting()
    }

    /// Where `key`'s lane is, checked to be in `phase`.
    private mutating func index(
        ofLane key: LaneKey, in phase: Phase, _ message: @autoclosure () -> String
    ) -> [LaneKey: Lane].Index {
        let index = lanes.index(forKey: key)
        precondition(index.map { found in inPlace(&lanes.values[found]) { $0.phase == phase } } ?? false, message())
        return index!
    }

    /// Removes items not yet started that match `predicate`; returns them.
    mutating func removeWaiting(where predicate: (Item) -> Bool) -> [Item] {
        var removed: [Item] = []
        for key in Array(lanes.keys) {
            let taken = lanes[key]!.queue.removeAll(where: predicate)
            guard !taken.isEmpty else { continue }
            removed += taken
            if lanes[key]!.queue.isEmpty {
                switch lanes[key]!.phase {
                case .waitingForSlot: lanes[key] = nil
                case .running, .finishing: break
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
            guard let index = lanes.index(forKey: key), inPlace(&lanes.values[index], { $0.phase == .waitingForSlot }),
                let item = lanes.values[index].queue.popFirst()
            else { continue }
            lanes.values[index].phase = .running
            inFlight += 1
            return item
        }
        return nil
    }
}

/// A user's lane, keyed as the ledger and the changelog are: `{app_id}:{app_user_id}`, built and hashed once.
struct UserLane: Hashable, Sendable {
    /// The user's key in the changelog and the ledger: `{app_id}:{app_user_id}`, built once.
    let key: String
    private let hashCode: Int

    init(appID: String, appUserID: String) {
        self.init(key: userKey(appID: appID, appUserID: appUserID))
    }

    /// `key`: a user's key, `{app_id}:{app_user_id}`.
    init(key: String) {
        self.key = key
        hashCode = key.hashValue
    }

    func hash(into hasher: inout Hasher) { hasher.combine(hashCode) }

    /// Without a second `Hasher`: `hashCode` is already the key's seeded hash (a client chooses user
    /// ids, so a user key is never hashed by a fixed function).
    func _rawHashValue(seed: Int) -> Int { mixedHash(UInt64(bitPattern: Int64(hashCode ^ seed))) }

    static func == (lhs: UserLane, rhs: UserLane) -> Bool {
        lhs.hashCode == rhs.hashCode && lhs.key == rhs.key
    }
}
