/// A first-in first-out queue: a ring buffer, so push and pop never move the other elements.
struct FIFO<Element> {
    /// A power-of-two number of slots (or none); the elements are `count` slots from `head`, wrapping.
    private var slots: [Element?] = []
    private var head = 0
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }
    var first: Element? { isEmpty ? nil : slots[head] }

    /// The element `offset` places from the first (`0` is the first).
    subscript(offset: Int) -> Element {
        precondition(offset >= 0 && offset < count, "FIFO offset \(offset) out of 0..<\(count)")
        return slots[(head + offset) & (slots.count - 1)]!
    }

    mutating func append(_ element: Element) {
        if count == slots.count { grow() }
        slots[(head + count) & (slots.count - 1)] = element
        count += 1
    }

    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = slots[head].take()
        head = (head + 1) & (slots.count - 1)
        count -= 1
        if count == 0 { head = 0 }
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

    private mutating func grow() {
        var larger = [Element?](repeating: nil, count: max(4, slots.count * 2))
        for index in 0..<count { larger[index] = slots[(head + index) & (slots.count - 1)].take() }
        slots = larger
        head = 0
    }
}

extension FIFO: Sendable where Element: Sendable {}
