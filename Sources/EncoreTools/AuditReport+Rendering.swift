import EncoreEvents

extension AuditReport {
    /// One JSON object: every discrepancy's count under its name, `discrepancies` (the failures),
    /// `range`, `figures` and `examples` (request id, user and coordinates, per discrepancy).
    public func json() -> String {
        var writer = JSONWriter(capacity: 4096)
        writer.beginObject()
        for discrepancy in Discrepancy.allCases {
            writer.key(dynamic: discrepancy.rawValue)
            writer.integer(Int64(count(discrepancy)))
        }
        writer.field("discrepancies", failures)
        writer.key("range")
        writer.beginObject()
        writer.field("from_ms", range.fromMs)
        writer.field("to_ms", range.toMs)
        writer.endObject()
        writer.key("figures")
        writer.beginObject()
        writer.field("requests", figures.requests)
        writer.field("resent_requests", figures.resentRequests)
        writer.field("request_id_conflicts", figures.requestIDConflicts)
        writer.key("in_doubt")
        writer.beginObject()
        writer.field("opened", figures.inDoubtOpened)
        writer.field("resolved", figures.inDoubtResolved)
        writer.field("expired", figures.inDoubtExpired)
        writer.field("open", figures.inDoubtOpen)
        writer.endObject()
        writer.field("outcomes", figures.outcomes)
        for (name, counts) in [
            ("outcomes_by_result", figures.outcomesByResult), ("outcomes_by_controller", figures.outcomesByController),
            ("dead_letters_by_stage", figures.deadLettersByStage),
            ("dead_letters_by_class", figures.deadLettersByClass), ("changes_by_kind", figures.changesByKind),
            ("in_doubt_resolved_by_result", figures.resolvedInDoubtByResult),
            ("load_test_requests_by_run", figures.loadTestRequests),
        ] {
            writer.key(dynamic: name)
            writer.beginObject()
            for (key, value) in counts.sorted(by: { $0.key < $1.key }) {
                writer.key(dynamic: key)
                writer.integer(Int64(value))
            }
            writer.endObject()
        }
        writer.key("latency_ms")
        writer.beginObject()
        for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            writer.key(dynamic: name)
            writer.integer(Int64(figures.latencyMs.percentile(q)))
        }
        writer.field("max", Int64(figures.latencyMs.max))
        writer.endObject()
        writer.field("requests_held_from_ms", figures.requestsHeldFromMs)
        writer.field("outcomes_held_from_ms", figures.outcomesHeldFromMs)
        writer.field("undecodable_outcomes", figures.undecodableOutcomes)
        writer.field("undecodable_changes", figures.undecodableChanges)
        writer.field("undecodable_dead_letters", figures.undecodableDeadLetters)
        writer.endObject()
        writer.key("examples")
        writer.beginObject()
        for discrepancy in Discrepancy.allCases {
            writer.key(dynamic: discrepancy.rawValue)
            writer.beginArray()
            for example in (examples[discrepancy] ?? []).prefix(Self.examplesInJSON) {
                writer.beginObject()
                writer.field("request_id", example.requestID)
                writer.field("user", example.user)
                writer.field("topic", example.at.topic)
                writer.field("partition", Int(example.at.partition))
                writer.field("offset", example.at.offset)
                writer.field("detail", example.detail)
                writer.endObject()
            }
            writer.endArray()
        }
        writer.endObject()
        writer.endObject()
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    /// The terminal view: the figures, a table of the discrepancies, and their examples.
    public func table() -> String {
        var lines: [String] = []
        let span = [
            range.fromMs.map { "from \(CloudEventHeaders.rfc3339(ms: $0))" },
            range.toMs.map {
                "to \(CloudEventHeaders.rfc3339(ms: $0))"
            },
        ].compactMap { $0 }
        lines.append("Audit of \(span.isEmpty ? "every request" : "the requests " + span.joined(separator: " "))")
        lines.append("")
        lines.append(
            "requests \(figures.requests) (\(figures.resentRequests) re-sent ids, \(figures.loadTestRequests.values.reduce(0, +)) from load tests), outcomes \(figures.outcomes)"
        )
        lines.append("  by result:     " + Self.inline(figures.outcomesByResult))
        lines.append(
            "  in doubt:      \(figures.inDoubtOpened) opened, \(figures.inDoubtResolved) resolved ("
                + Self.inline(figures.resolvedInDoubtByResult)
                + "), \(figures.inDoubtExpired) expired, \(figures.inDoubtOpen) still open; \(figures.requestIDConflicts) request_id conflicts"
        )
        lines.append("  by controller: " + Self.inline(figures.outcomesByController))
        lines.append(
            "  latency (request → outcome): p50 \(figures.latencyMs.percentile(0.5)) ms, p90 \(figures.latencyMs.percentile(0.9)) ms, p99 \(figures.latencyMs.percentile(0.99)) ms, max \(figures.latencyMs.max) ms"
        )
        if let from = figures.requestsHeldFromMs {
            lines.append(
                "  retention deleted early requests: every partition holds them from \(CloudEventHeaders.rfc3339(ms: from)) (older outcomes are not called orphans)"
            )
        }
        lines.append("dead letters by stage: " + Self.inline(figures.deadLettersByStage))
        lines.append("dead letters by class: " + Self.inline(figures.deadLettersByClass))
        lines.append("entitlement changes by kind: " + Self.inline(figures.changesByKind))
        lines.append("")
        let width = Discrepancy.allCases.map(\.rawValue.count).max()!
        for discrepancy in Discrepancy.allCases {
            let marker = count(discrepancy) > 0 && discrepancy.isFailure ? "  ✗" : ""
            lines.append(
                "  " + discrepancy.rawValue.padding(toLength: width, withPad: " ", startingAt: 0) + "  "
                    + String(count(discrepancy)) + marker)
        }
        lines.append("")
        lines.append(failures == 0 ? "no discrepancies" : "\(failures) discrepancies")
        for discrepancy in Discrepancy.allCases where !(examples[discrepancy] ?? []).isEmpty {
            lines.append("")
            lines.append("\(discrepancy.rawValue) (\(count(discrepancy))):")
            for example in examples[discrepancy]!.prefix(Self.examplesInJSON) { lines.append("  " + example.line) }
            if count(discrepancy) > Self.examplesInJSON {
                lines.append("  ... (\(count(discrepancy) - Self.examplesInJSON) more in --html)")
            }
        }
        return lines.joined(separator: "\n")
    }

    static func inline(_ counts: [String: Int]) -> String {
        counts.isEmpty ? "-" : counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
    }
}

extension AuditReport.Example {
    /// `request r-1  user app:u  topic[p]@o  detail`.
    public var line: String {
        var parts: [String] = []
        if let requestID { parts.append("request \(requestID)") }
        if let user { parts.append("user \(user)") }
        parts.append(at.offset < 0 ? "\(at.topic)[\(at.partition)]" : "\(at.topic)[\(at.partition)]@\(at.offset)")
        if let detail { parts.append(detail) }
        return parts.joined(separator: "  ")
    }
}
