/// Request ids that already have an outcome, within a bounded window of the most recent ones.
///
/// A duplicate request (a replay, or a client sending twice) whose id is in the window is not
/// sent to a controller again and produces no new outcome.
struct RecentRequests {
    let capacity: Int
    private var order = FIFO<HashedString>()
    private var members = Set<HashedString>()

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    func contains(_ requestID: HashedString) -> Bool { members.contains(requestID) }

    mutating func insert(_ requestID: HashedString) {
        guard members.insert(requestID).inserted else { return }
        order.append(requestID)
        if order.count > capacity, let oldest = order.popFirst() {
            members.remove(oldest)
        }
    }
}
