/// A first-in first-out queue with amortized O(1) push and pop.
struct FIFO<Element> {
    private var storage: [Element] = []
    private var head = 0

    var isEmpty: Bool { head == storage.count }
    var count: Int { storage.count - head }
    var first: Element? { isEmpty ? nil : storage[head] }

    mutating func append(_ element: Element) {
        storage.append(element)
    }

    mutating func popFirst() -> Element? {
        guard head < storage.count else { return nil }
        let element = storage[head]
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.count <= 64)
            head = 0
        } else if head >= 64 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }

    /// Removes the elements matching `predicate`, keeping the order of the rest; returns the removed ones.
    mutating func removeAll(where predicate: (Element) -> Bool) -> [Element] {
        var kept: [Element] = []
        var removed: [Element] = []
        for element in storage[head...] {
            if predicate(element) { removed.append(element) } else { kept.append(element) }
        }
        storage = kept
        head = 0
        return removed
    }
}
