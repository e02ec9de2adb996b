import Synchronization

/// A many-writer, one-reader mailbox that hands the reader everything posted since its last
/// read, so a busy loop wakes once per batch rather than once per event.
final class Inbox<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        var waiter: CheckedContinuation<[Element], Never>? = nil
    }

    private let state = Mutex(State())

    func post(_ element: Element) {
        let waiter = state.withLock { state -> CheckedContinuation<[Element], Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.items.append(element)
            return nil
        }
        waiter?.resume(returning: [element])
    }

    /// Everything posted so far, waiting for the first post when there is none. One reader only.
    func next() async -> [Element] {
        if let ready = takeAll() { return ready }
        return await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> [Element]? in
                if state.items.isEmpty {
                    state.waiter = continuation
                    return nil
                }
                let items = state.items
                state.items = []
                return items
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    private func takeAll() -> [Element]? {
        state.withLock { state in
            guard !state.items.isEmpty else { return nil }
            let items = state.items
            state.items = []
            return items
        }
    }
}
