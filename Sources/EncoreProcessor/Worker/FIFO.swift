/// A first-in first-out queue: a ring buffer, so a push moves no other element and a pop moves one
/// (the next, out of the ring). The first element is held apart from the ring, so a queue that
/// never holds more than one (a user's updates, a lane's waiting requests: usually one at a time)
/// allocates nothing.
struct FIFO<Element> {
    /// The first element; `nil` only when the queue is empty.
    private var front: Element? = nil
    /// The elements after the first: a power-of-two number of slots (or none), the `count - 1`
    /// elements from `head` on, wrapping.
    private var slots: [Element?] = []
    private var head = 0
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }
    var first: Element? { front }

    /// The element `offset` places from the first (`0` is the first).
    subscript(offset: Int) -> Element {
        precondition(offset >= 0 && offset < count, "FIFO offset \(offset) out of 0..<\(count)")
        return offset == 0 ? front! : slots[(head + offset - 1) & (slots.count - 1)]!
    }

    mutating func append(_ element: Element) {
        guard count > 0 else {
            front = element
            count = 1
            return
        }
        let behind = count - 1
        if behind == slots.count { grow() }
        slots[(head + behind) & (slots.count - 1)] = element
        count += 1
    }

    mutating func popFirst() -> Element? {
        guard let element = front.take() else { return nil }
        count -= 1
        if count > 0 {
            front = slots[head].take()
            head = (head + 1) & (slots.count - 1)
        }
        return element
    }

    /// Removes the elements matching `predicate`, keeping the order of the rest; returns the removed ones.
    mutating func removeAll(where predicate: (Element) -> Bool) -> [Element] {
        var kept = FIFO()
        var removed: [Element] = []
        while let element = popFirst() {
            if predicate(element) { removed.append(element) } else { kept.append(element) }
        }
        self = kept
        return removed
    }

    /// Doubles the ring (at least four slots), its elements moved to its start.
    private mutating func grow() {
        var larger = [Element?](repeating: nil, count: max(4, slots.count * 2))
        for index in 0..<(count - 1) { larger[index] = slots[(head + index) & (slots.count - 1)].take() }
        slots = larger
        head = 0
    }
}

extension FIFO: Sendable where Element: Sendable {}
