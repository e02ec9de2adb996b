import Foundation
import Synchronization

extension StateStore {
    /// A restore's writes on a thread of their own, in the order given: the restore reads and
    /// indexes the next batch while RocksDB inserts this one into its memtables (the larger part of
    /// a rebuild's CPU). At most two are queued, one of them being written. The first write that
    /// fails fails the ones after it and is thrown by the next ``write(_:logged:)`` or ``drain()``.
    final class BatchWriter: Sendable {
        /// `@unchecked Sendable` (a C handle): the thread that built the batch gives it up in
        /// ``write(_:logged:)``, and only the writer's thread touches it after.
        private struct HandedOver: @unchecked Sendable {
            let batch: RocksDB.Batch
            let logged: Bool
        }

        private struct Queue {
            var batches: [HandedOver] = []
            var failure: RocksDBError? = nil
        }

        private let queue = Mutex(Queue())
        /// Signalled for each batch queued, and once by ``finish()``.
        private let queued = DispatchSemaphore(value: 0)
        private let room = DispatchSemaphore(value: 2)
        private let unwritten = DispatchGroup()

        /// Starts the writer's thread, which runs until ``finish()``. `lag` (tests): each write
        /// waits this long first, as a busy machine's writer falls behind.
        init(_ store: StateStore, lag: Duration = .zero) {
            let db = store.db
            let lagMicroseconds = UInt32(
                lag.components.seconds * 1_000_000 + lag.components.attoseconds / 1_000_000_000_000)
            Thread.startNamed("encore.batches") { [self] in
                while true {
                    queued.wait()
                    guard let next = queue.withLock({ $0.batches.isEmpty ? nil : $0.batches.removeFirst() }) else {
                        return  // finished
                    }
                    if lagMicroseconds > 0 { usleep(lagMicroseconds) }
                    if queue.withLock({ $0.failure == nil }) {
                        do throws(RocksDBError) { try db.write(next.batch, synced: false, logged: next.logged) } catch {
                            queue.withLock { $0.failure = error }
                        }
                    }
                    room.signal()
                    unwritten.leave()
                }
            }
        }

        /// Queues `batch`, waiting while two are queued; throws an earlier write's failure.
        func write(_ batch: sending RocksDB.Batch, logged: Bool) throws(RocksDBError) {
            if let failure = queue.withLock({ $0.failure }) { throw failure }
            room.wait()
            unwritten.enter()
            let handedOver = HandedOver(batch: batch, logged: logged)
            queue.withLock { $0.batches.append(handedOver) }
            queued.signal()
        }

        /// Waits until every batch queued is written; throws the first failure.
        func drain() throws(RocksDBError) {
            unwritten.wait()
            if let failure = queue.withLock({ $0.failure }) { throw failure }
        }

        /// Waits for the queued batches (whatever their result) and ends the thread.
        func finish() {
            unwritten.wait()
            queued.signal()
        }
    }
}
