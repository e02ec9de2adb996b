import Foundation
import Kafka
import Synchronization

extension StateStore {
    /// RocksDB's compactions around bulk rebuilds (docs/STATE.md, Restore).
    ///
    /// While a rebuild loads, automatic compactions are off: its files pile up in the first level
    /// instead of being rewritten level by level as the tree grows. Then the rebuilt range is
    /// compacted once, on a thread of its own while the processor goes on: the restore is ready
    /// before it, and reads meanwhile look into more files. Until that compaction is through and
    /// the first level is back under RocksDB's slowdown threshold, writes neither slow down nor
    /// stop for the number of first-level files: they would until the compaction ends (Kafka
    /// Streams dropped its bulk loading for those stalls after a restore).
    final class Compactions: Sendable {
        private struct State {
            /// Bulk loads running: while any is, automatic compactions are off.
            var loading = 0
            /// Background compactions not through yet.
            var catchingUp = 0
            var closed = false
            /// What RocksDB was last told.
            var paused = false
            var relaxed = false
        }

        private let db: RocksDB
        private let logger: Logger
        private let state = Mutex(State())
        private let running = DispatchGroup()
        /// (Tests: each background compaction waits for a signal of it before it starts.)
        private let gate: DispatchSemaphore?

        init(_ db: RocksDB, logger: Logger, gate: DispatchSemaphore? = nil) {
            self.db = db
            self.logger = logger
            self.gate = gate
        }

        /// A bulk load begins: automatic compactions pause until every load running has ended.
        func pause() throws(RocksDBError) {
            try state.withLock { (state) throws(RocksDBError) in
                state.loading += 1
                do throws(RocksDBError) { try apply(&state) } catch {
                    state.loading -= 1
                    throw error
                }
            }
        }

        /// A bulk load ended (also when this throws): automatic compactions resume (with no other
        /// load running), and the keys from `start` to `end` (none: nothing) are compacted in the
        /// background, writes never stalled by the first level's files until that is through. A
        /// closed store compacts nothing.
        func resume(compacting range: (start: [UInt8], end: [UInt8])?, what: String) throws(RocksDBError) {
            let started = try state.withLock { (state) throws(RocksDBError) -> Bool in
                state.loading -= 1
                guard !state.closed else { return false }
                if range != nil { state.catchingUp += 1 }
                do throws(RocksDBError) { try apply(&state) } catch {
                    if range != nil { state.catchingUp -= 1 }
                    throw error
                }
                return range != nil
            }
            if started, let range { compactInBackground(from: range.start, to: range.end, what: what) }
        }

        /// At open: a first level at RocksDB's slowdown threshold or above (a bulk load killed
        /// before its compaction) is compacted in the background, writes not stalled meanwhile.
        func catchUpIfPiledUp() throws(RocksDBError) {
            guard let files = db.firstLevelFiles(), files >= RocksDB.firstLevelStalls.slowdown else { return }
            try state.withLock { (state) throws(RocksDBError) in
                state.catchingUp += 1
                do throws(RocksDBError) { try apply(&state) } catch {
                    state.catchingUp -= 1
                    throw error
                }
            }
            compactInBackground(from: [], to: [0xff], what: "the store's \(files) first-level files")
        }

        /// Stops the background compactions (RocksDB abandons a running one: its files stay as
        /// they were) and waits for their threads, on every call: before the database closes.
        func close() {
            let (wasClosed, waiting) = state.withLock { state in
                defer { state.closed = true }
                return (state.closed, state.catchingUp)
            }
            if !wasClosed {
                db.stopManualCompactions()
                // (Each compaction not through yet waits for one signal at most.)
                for _ in 0..<waiting { gate?.signal() }
            }
            running.wait()
        }

        /// Waits until the background compactions started so far are through (tests).
        func waitForBackground() { running.wait() }

        /// Whether writes are spared the first level's stalls now, and compactions paused.
        var settings: (paused: Bool, relaxed: Bool) { state.withLock { ($0.paused, $0.relaxed) } }

        private func compactInBackground(from start: [UInt8], to end: [UInt8], what: String) {
            running.enter()
            logger.info("compacting \(what) in the background")
            Thread.startNamed("encore.compact") { [self] in
                defer { running.leave() }
                let clock = ContinuousClock()
                let began = clock.now
                gate?.wait()
                if !state.withLock({ $0.closed }) { db.compact(from: start, to: end) }
                // The newer first-level files (written meanwhile: the manual compaction held off
                // automatic ones) are left to automatic compactions: the stalls return once they
                // have taken the level back under the threshold, or after a minute at most (writes
                // faster than compactions then are slowed down again, as RocksDB means them to be).
                let compacted = clock.now
                while clock.now - compacted < .seconds(60), !state.withLock({ $0.closed || $0.loading > 0 }),
                    (db.firstLevelFiles() ?? 0) >= RocksDB.firstLevelStalls.slowdown
                {
                    usleep(100_000)
                }
                let (closed, failure) = state.withLock { state -> (Bool, RocksDBError?) in
                    state.catchingUp -= 1
                    guard !state.closed else { return (true, nil) }
                    do throws(RocksDBError) { try apply(&state) } catch { return (false, error) }
                    return (false, nil)
                }
                if closed {
                    logger.info("stopped compacting \(what): the store closes")
                } else if let failure {
                    logger.warning("compacted \(what), but RocksDB's write stalls were not set back: \(failure)")
                } else {
                    logger.info("compacted \(what) in \(clock.now - began)")
                }
            }
        }

        /// Tells RocksDB what `state` asks for: compactions paused while a load runs; the first
        /// level's stalls relaxed while a background compaction runs (set before compactions resume).
        private func apply(_ state: inout State) throws(RocksDBError) {
            let relaxed = state.catchingUp > 0
            if relaxed != state.relaxed {
                try db.relaxFirstLevelStalls(relaxed)
                state.relaxed = relaxed
            }
            let paused = state.loading > 0
            if paused != state.paused {
                try db.setAutomaticCompactions(!paused)
                state.paused = paused
            }
        }
    }
}
