import Foundation
import Kafka
import Synchronization

/// Whether the processor is alive (its loops tick) and ready (joined, restored, not failed):
/// what `/healthz` and `/readyz` answer.
public struct ProcessorHealth: Sendable, Equatable {
    public var isAlive: Bool
    public var isReady: Bool
    /// Why it is not alive or not ready, in words.
    public var reasons: [String]
}

/// What only the processor knows (the loops know the rest): run state, group membership, ledger
/// restores, the buffer. Written by the processor's tasks, read by anyone.
final class ProcessorVitals: Sendable {
    struct State {
        var startedAtMs: Int64? = nil
        var running = false
        var joined = false
        var restoring = 0
        var failure: String? = nil
        var restores = 0
        var restoredUsers = 0
        var restoreSeconds = 0.0
        /// With a state store: changelog records restores read (the tails past the checkpoints),
        /// and records they took from the store.
        var restoredChangelogRecords = 0
        var restoredStoreRecords = 0
        /// The restore running now: changelog records it reads (from the checkpoints to the ends
        /// read at its start) and has read; records taken from the store.
        var restoreTarget = 0
        var restoreRead = 0
        var restoreFromStore = 0
        /// Rebalance events this process saw: assignments and revocations.
        var assignments = 0
        var revocations = 0
        var admission: KafkaAdmission? = nil
        var consumer: KafkaConsumer? = nil
        var store: StateStoreWriter? = nil
    }

    let state = Mutex(State())

    func update(_ body: (inout State) -> Void) { state.withLock { body(&$0) } }

    var snapshot: State { state.withLock { $0 } }
}

extension PurchaseProcessor {
    /// A loop that has not ticked for this long is stuck (it ticks every 20 ms).
    public static let livenessWindow: Duration = .seconds(5)

    /// Alive: running, not failed, every loop ticked within ``livenessWindow``. Ready: alive,
    /// joined the group, no ledger restore running.
    public func health(nowMs: Int64 = Int64(Date().timeIntervalSince1970 * 1000)) -> ProcessorHealth {
        ProcessorHealth(vitals: vitals.snapshot, lastTickAtMs: statistics.lastTickAtMs, nowMs: nowMs)
    }
}

extension ProcessorHealth {
    /// The verdict on what the processor knows (`lastTickAtMs`: the stalest loop's last tick, 0
    /// before the first).
    init(vitals: ProcessorVitals.State, lastTickAtMs: Int64, nowMs: Int64) {
        var reasons: [String] = []
        if !vitals.running { reasons.append("not running") }
        if let failure = vitals.failure { reasons.append("failed: \(failure)") }
        let since = lastTickAtMs > 0 ? lastTickAtMs : vitals.startedAtMs ?? nowMs
        let stale = nowMs - since
        if vitals.running && stale > Int64(PurchaseProcessor.livenessWindow.components.seconds) * 1000 {
            reasons.append("a dispatch loop has not ticked for \(stale) ms")
        }
        let isAlive = reasons.isEmpty
        if !vitals.joined { reasons.append("not joined to the group yet") }
        if vitals.restoring > 0 {
            let progress =
                vitals.restoreTarget > 0 || vitals.restoreFromStore > 0
                ? ": \(vitals.restoreRead) of \(vitals.restoreTarget) changelog records read, \(vitals.restoreFromStore) records from the state store"
                : ""
            reasons.append("restoring the ledger state\(progress)")
        }
        self.init(isAlive: isAlive, isReady: reasons.isEmpty, reasons: reasons)
    }
}
