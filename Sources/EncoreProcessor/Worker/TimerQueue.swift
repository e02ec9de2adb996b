/// A min-heap of deadlines with payloads: retries and re-deliveries, expiries that are due later.
struct TimerQueue<Due: Comparable, Payload> {
    private var heap: [(due: Due, payload: Payload)] = []

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }
    /// The earliest deadline, if any.
    var firstDue: Due? { heap.first?.due }

    mutating func schedule(_ payload: Payload, at due: Due) {
        heap.append((due, payload))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].due < heap[parent].due else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns the payloads due at or before `now`, earliest first.
    mutating func popDue(now: Due) -> [Payload] {
        var due: [Payload] = []
        while let first = heap.first, first.due <= now {
            due.append(first.payload)
            heap.swapAt(0, heap.count - 1)
            heap.removeLast()
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var smallest = parent
                if left < heap.count, heap[left].due < heap[smallest].due { smallest = left }
                if right < heap.count, heap[right].due < heap[smallest].due { smallest = right }
                if smallest == parent { break }
                heap.swapAt(parent, smallest)
                parent = smallest
            }
        }
        return due
    }
}

extension TimerQueue: Sendable where Due: Sendable, Payload: Sendable {}
