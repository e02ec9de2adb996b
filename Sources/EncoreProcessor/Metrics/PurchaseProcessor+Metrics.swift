import EncoreEvents
import Foundation
import Kafka

extension PurchaseProcessor {
    /// Bucket bounds (seconds) of the latency histograms.
    static let secondsBuckets: [Double] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    /// The counters, gauges and histograms in Prometheus' text format (`/metrics`).
    public func metrics(nowMs: Int64 = Int64(Date().timeIntervalSince1970 * 1000)) -> String {
        let statistics = self.statistics
        let vitals = self.vitals.snapshot
        let health = self.health(nowMs: nowMs)
        var text = PrometheusText()
        text.gauge(
            "encore_build_info", "The version running, and librdkafka's.",
            [(["version": EncoreVersion.current, "librdkafka": LibrdkafkaVersion.string], 1)])
        text.gauge("encore_up", "1 while the dispatch loops are alive (/healthz).", [([:], health.isAlive ? 1 : 0)])
        text.gauge("encore_ready", "1 when joined and restored (/readyz).", [([:], health.isReady ? 1 : 0)])
        text.counter("encore_requests_received_total", "Request records read.", [([:], statistics.received)])
        text.counter(
            "encore_outcomes_total", "Outcomes published, by result and controller.",
            statistics.outcomesByController.map { (["result": $0.key.first, "controller": $0.key.second], $0.value) })
        text.counter(
            "encore_loadtest_outcomes_total",
            "Outcomes of requests a load test produced (attributes.encore_loadtest_run), also counted above.",
            [([:], statistics.loadTestOutcomes)])
        text.counter("encore_controller_calls_total", "Controller calls made.", [([:], statistics.controllerCalls)])
        text.counter(
            "encore_controller_errors_total", "Controller calls that ended in an error, by type.",
            statistics.controllerErrors.map { (["type": $0.key], $0.value) })
        text.counter("encore_retries_total", "Calls retrying an earlier attempt.", [([:], statistics.retries)])
        text.counter(
            "encore_recovery_calls_total", "Calls that may follow one that reached billing.",
            [([:], statistics.recoveryCalls)])
        text.counter(
            "encore_late_intents_total",
            "Intents too old to start their call when it could start (a loaded machine, a slow transaction, a call slot long in coming), by what was done: held (a recovery call once a next owner's hold is over), rewritten (the intent written again first).",
            [
                (["action": "held"], statistics.lateIntents.held),
                (["action": "rewritten"], statistics.lateIntents.rewritten),
            ])
        text.counter(
            "encore_in_doubt_total",
            "Requests in doubt (attempts used up, billing's answer unknown), by what became of them: opened (pending published), resolved (billing answered: final outcome published), expired (past --reconcile-for: dead letter in_doubt_expired).",
            [
                (["event": "opened"], statistics.inDoubtOpened), (["event": "resolved"], statistics.inDoubtResolved),
                (["event": "expired"], statistics.inDoubtExpired),
            ])
        text.gauge(
            "encore_in_doubt_open", "Requests in doubt now: their users' lanes are held while billing is asked again.",
            [([:], statistics.inDoubtOpen)])
        text.gauge(
            "encore_in_doubt_oldest_age_seconds", "How long the oldest request in doubt has been (0: none).",
            [([:], statistics.oldestInDoubtSinceMs.map { Double(max(0, nowMs - $0)) / 1000 } ?? 0)])
        text.counter(
            "encore_reconcile_calls_total", "Recovery calls asking billing about a request in doubt.",
            [([:], statistics.reconcileCalls)])
        text.counter(
            "encore_request_id_conflicts_total",
            "Records reusing a journaled request_id with other content (dead letter request_id_conflict).",
            [([:], statistics.requestIDConflicts)])
        text.counter(
            "encore_dead_letters_total", "Dead letters published, by stage and class.",
            statistics.deadLettersByClass.map { (["stage": $0.key.first, "class": $0.key.second], $0.value) })
        text.counter(
            "encore_duplicates_skipped_total", "Requests the journal answered without a call.",
            [([:], statistics.duplicates)])
        text.counter(
            "encore_entitlement_changes_total", "Entitlement changes published, by kind.",
            statistics.changesByKind.map { (["kind": $0.key], $0.value) })
        text.histogram(
            "encore_controller_call_seconds", "How long controller calls took.", statistics.callDuration,
            buckets: Self.secondsBuckets)
        text.histogram(
            "encore_request_to_outcome_seconds", "Request time to outcome acknowledged.", statistics.latency,
            buckets: Self.secondsBuckets)
        text.gauge("encore_in_flight_calls", "Controller calls running.", [([:], statistics.inFlight)])
        text.gauge(
            "encore_state_users_in_memory",
            "Users whose state and journal are in memory (with --state-cache-users; else every user of the owned partitions).",
            [([:], statistics.residentUsers)])
        if let usage = vitals.store?.usage {
            text.gauge(
                "encore_state_store_memory_bytes",
                "RocksDB's memory (outside the Swift heap) by part: block_cache (--state-cache-mb), memtables, table_readers.",
                [
                    (["part": "block_cache"], Int(usage.blockCacheBytes)),
                    (["part": "memtables"], Int(usage.memtableBytes)),
                    (["part": "table_readers"], Int(usage.tableReaderBytes)),
                ])
            text.gauge(
                "encore_state_store_disk_bytes", "The state store's table files on disk.",
                [([:], Int(usage.diskBytes))])
        }
        text.counter(
            "encore_state_user_reads_total", "Users read from the state store when their records arrived.",
            [([:], statistics.userLoads)])
        text.counter(
            "encore_state_user_evictions_total", "Users let go from memory (kept in the state store).",
            [([:], statistics.userEvictions)])
        text.gauge(
            "encore_buffered_records", "Records read and not yet done (the buffer).",
            [([:], vitals.admission?.held ?? 0)])
        text.gauge(
            "encore_assigned_partitions", "Input partitions assigned to this process.",
            [([:], statistics.assignedPartitions)])
        text.gauge(
            "encore_consumer_lag", "Records behind the end of each assigned partition (librdkafka's statistics).",
            (vitals.consumer?.lag ?? [:]).map {
                (["topic": $0.key.topic, "partition": String($0.key.partition)], $0.value)
            })
        // Why a consumer stalls, from the same statistics: the last stable offset held below the
        // high watermark (an open transaction), no assignment, or a fetch that is not active.
        let consumer = vitals.consumer?.statistics ?? KafkaConsumerStatistics()
        text.gauge(
            "encore_consumer_offsets",
            "Per assigned partition: the high watermark (hi), the last stable offset a read_committed reader reads to (ls), the next offset to fetch (next).",
            consumer.partitions.flatMap { key, value in
                [("hi", value.highWatermark), ("ls", value.lastStableOffset), ("next", value.nextOffset)].map {
                    (["topic": key.topic, "partition": String(key.partition), "offset": $0.0], $0.1)
                }
            })
        text.gauge(
            "encore_consumer_fetch_state", "1 for each assigned partition's fetch state (active when fetching).",
            consumer.partitions.map {
                (["topic": $0.key.topic, "partition": String($0.key.partition), "state": $0.value.fetchState], 1)
            })
        text.gauge(
            "encore_consumer_group_state",
            "1 for the group's state and join state (up, steady once assigned), with this member's assignment size.",
            consumer.groupState.map {
                [
                    (
                        [
                            "state": $0, "join_state": consumer.joinState ?? "-",
                            "assignment_size": String(consumer.assignmentSize ?? 0),
                        ], 1
                    )
                ]
            } ?? [])
        text.counter(
            "encore_commit_failures_total", "Offset commits that failed (retried).", [([:], statistics.commitFailures)])
        text.counter("encore_ledger_restores_total", "Ledger restores (one per assignment).", [([:], vitals.restores)])
        text.counter(
            "encore_ledger_restored_users_total", "Users whose state restores read.", [([:], vitals.restoredUsers)])
        text.counter(
            "encore_ledger_restore_seconds_total", "Time spent restoring ledger state.",
            [([:], vitals.restoreSeconds)])
        text.counter(
            "encore_state_restore_changelog_records_total",
            "Changelog records restores read (with --state-dir: only past the store's checkpoints).",
            [([:], vitals.restoredChangelogRecords)])
        text.counter(
            "encore_state_restore_store_records_total", "Records restores took from the local state store.",
            [([:], vitals.restoredStoreRecords)])
        text.gauge("encore_restoring", "Ledger restores running now (not ready meanwhile).", [([:], vitals.restoring)])
        text.counter(
            "encore_rebalances_total", "Rebalance events: partitions assigned to this process, or revoked from it.",
            [(["event": "assigned"], vitals.assignments), (["event": "revoked"], vitals.revocations)])
        text.gauge(
            "encore_loop_tick_age_seconds",
            "Seconds since the stalest dispatch loop ticked (they tick every 20 ms; 5 s is a stall, /healthz 503).",
            [
                (
                    [:],
                    Double(
                        max(
                            0,
                            nowMs
                                - (statistics.lastTickAtMs > 0 ? statistics.lastTickAtMs : vitals.startedAtMs ?? nowMs))
                    ) / 1000
                )
            ])
        let resources = ProcessResources.current()
        text.counter("process_cpu_seconds_total", "User and system CPU time spent.", [([:], resources.cpuSeconds)])
        text.gauge("process_resident_memory_bytes", "Resident memory size.", [([:], resources.residentBytes)])
        text.gauge(
            "process_start_time_seconds", "Start time of the process since the epoch.",
            [([:], resources.startTimeSeconds)])
        text.gauge("process_open_fds", "Open file descriptors.", [([:], resources.openDescriptors)])
        return text.text
    }
}

/// Writes Prometheus' text exposition format.
struct PrometheusText {
    private(set) var text = ""

    mutating func counter(_ name: String, _ help: String, _ samples: [([String: String], any Numeric)]) {
        family(name, "counter", help, samples)
    }

    mutating func gauge(_ name: String, _ help: String, _ samples: [([String: String], any Numeric)]) {
        family(name, "gauge", help, samples)
    }

    /// A histogram of microsecond values, in seconds.
    mutating func histogram(_ name: String, _ help: String, _ values: LatencyHistogram, buckets: [Double]) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for bound in buckets {
            let count = values.count(atMost: UInt64(bound * 1_000_000))
            text += "\(name)_bucket{le=\"\(Self.number(bound))\"} \(count)\n"
        }
        text += "\(name)_bucket{le=\"+Inf\"} \(values.count)\n"
        text += "\(name)_sum \(Self.number(Double(values.sum) / 1_000_000))\n"
        text += "\(name)_count \(values.count)\n"
    }

    private mutating func family(
        _ name: String, _ type: String, _ help: String, _ samples: [([String: String], any Numeric)]
    ) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        let rendered = samples.map { labels, value in
            let pairs = labels.sorted { $0.key < $1.key }.map { "\($0.key)=\"\(Self.escape($0.value))\"" }
            return (pairs.isEmpty ? name : "\(name){\(pairs.joined(separator: ","))}") + " \(Self.number(value))"
        }
        for line in rendered.sorted() { text += line + "\n" }
    }

    static func escape(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
    }

    static func number(_ value: any Numeric) -> String {
        switch value {
        case let double as Double:
            double == double.rounded() && abs(double) < 1e15 ? String(Int64(double)) : "\(double)"
        default: "\(value)"
        }
    }
}
