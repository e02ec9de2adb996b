import EncoreEvents
import Foundation

/// What a load test found: offered and achieved throughput, latency, missing and duplicate
/// outcomes, results by kind, the knee of a ramp and whether the SLO held. Rendered as a table,
/// JSON, a self-contained HTML page or an HdrHistogram log.
public struct LoadTestReport: Sendable {
    public var runID: String
    public var startedAt: Date
    public var schedule: RateSchedule
    public var durationSeconds: Double
    /// Seconds production actually took (a busy producer catches up after `durationSeconds`).
    public var productionSeconds: Double
    /// Records produced (valid, duplicates and invalid), and acknowledged by the broker.
    public var sent: Int
    public var acknowledged: Int
    public var produceErrors: Int
    public var validSent: Int
    public var duplicatesSent: Int
    public var invalidSent: Int
    /// Valid requests with at least one outcome, and without any.
    public var answered: Int
    public var missing: Int
    public var missingExamples: [String]
    /// Outcomes beyond the first of a request (an in-doubt request's one final outcome after its
    /// `pending` is not one).
    public var duplicateOutcomes: Int
    /// Results of each request's first outcome.
    public var results: [String: Int]
    /// Requests that went in doubt (`pending`, `outcome_unknown`), were resolved by their final
    /// outcome within the run, and were still in doubt at its end.
    public var inDoubt: (opened: Int, resolved: Int, open: Int) = (0, 0, 0)
    public var deadLetters: Int
    /// Request-to-outcome latency of every answered request (microseconds).
    public var latency: HdrHistogram
    public var windows: [LoadTest.Window]
    public var lastAnsweredSeconds: Double
    public var slo: LoadTest.SLO

    public var isRamp: Bool { schedule.isRamp }

    /// The p99 bound that finds the knee of a ramp: the SLO's, else a second.
    public var kneeBoundMs: Double { slo.p99Ms ?? 1000 }

    public var offeredRate: Double { productionSeconds > 0 ? Double(sent) / productionSeconds : 0 }
    public var achievedRate: Double { lastAnsweredSeconds > 0 ? Double(answered) / lastAnsweredSeconds : 0 }

    static func milliseconds(_ histogram: HdrHistogram, _ percentile: Double) -> Double {
        Double(histogram.value(atPercentile: percentile)) / 1000
    }

    /// The windows in which requests were produced.
    var productionWindows: [LoadTest.Window] { windows.filter { $0.sent > 0 } }

    /// A ramp's knee: the highest offered rate before the first window whose requests had a p99
    /// above ``kneeBoundMs`` or were not all answered (`reachedEnd`: no window did). `nil` when the
    /// first window already failed.
    public var knee: (rate: Double, reachedEnd: Bool)? {
        var last: Double? = nil
        for window in productionWindows {
            if !Self.holds(window, boundMs: kneeBoundMs) { return last.map { ($0, false) } }
            last = window.offeredRate
        }
        return last.map { ($0, true) }
    }

    /// Whether every valid request produced in `window` was answered with p99 within `boundMs`.
    static func holds(_ window: LoadTest.Window, boundMs: Double) -> Bool {
        window.ofSent.totalCount >= Int64(window.validSent)
            && milliseconds(window.ofSent, 99) <= boundMs
    }

    /// Why the run fails its SLO; empty when it holds.
    public var failures: [String] {
        var failures: [String] = []
        if missing > slo.missing {
            failures.append("missing: \(missing) requests without an outcome (at most \(slo.missing))")
        }
        if produceErrors > 0 {
            failures.append("produce_errors: \(produceErrors) requests not delivered to the broker")
        }
        if let bound = slo.p99Ms, !isRamp, Self.milliseconds(latency, 99) > bound {
            failures.append(String(format: "p99: %.1f ms (at most %.1f ms)", Self.milliseconds(latency, 99), bound))
        }
        return failures
    }

    public var passed: Bool { failures.isEmpty }

    // MARK: Rendering

    private var offeredDescription: String {
        isRamp
            ? String(format: "ramp %.0f/s to %.0f/s over %.0f s", schedule.from, schedule.to, durationSeconds)
            : String(format: "%.0f/s for %.0f s", schedule.from, durationSeconds)
    }

    private var resultsDescription: String {
        results.isEmpty
            ? "none" : results.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
    }

    private var kneeDescription: String {
        guard isRamp else { return "- (not a ramp)" }
        guard let knee else {
            return String(format: "below %.0f/s (p99 above %.0f ms from the start)", schedule.from, kneeBoundMs)
        }
        return knee.reachedEnd
            ? String(format: "not reached: p99 within %.0f ms up to %.0f/s", kneeBoundMs, knee.rate)
            : String(format: "%.0f/s (the highest offered rate with p99 within %.0f ms)", knee.rate, kneeBoundMs)
    }

    /// The report as the terminal shows it.
    public func table() -> String {
        var lines = [
            "loadtest \(runID): \(offeredDescription)",
            String(
                format:
                    "offered      %d requests (%.1f/s), %d acknowledged, %d produce errors, %d duplicates, %d invalid",
                sent, offeredRate, acknowledged, produceErrors, duplicatesSent, invalidSent),
            String(
                format: "answered     %d of %d valid (%.1f/s achieved), %d missing, %d duplicate outcomes", answered,
                validSent, achievedRate, missing, duplicateOutcomes),
            "results      \(resultsDescription)",
            "in doubt     \(inDoubt.opened) opened, \(inDoubt.resolved) resolved, \(inDoubt.open) still pending at the end",
            "dead letters \(deadLetters)",
            String(
                format: "latency      p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  p99.9 %.1f ms  max %.1f ms",
                Self.milliseconds(latency, 50), Self.milliseconds(latency, 90), Self.milliseconds(latency, 99),
                Self.milliseconds(latency, 99.9), Double(latency.maxValue) / 1000),
            "knee         \(kneeDescription)",
        ]
        if !missingExamples.isEmpty {
            lines.append("missing e.g. \(missingExamples.prefix(5).joined(separator: ", "))")
        }
        lines.append(passed ? "SLO          held" : "SLO          FAILED: \(failures.joined(separator: "; "))")
        return lines.joined(separator: "\n")
    }

    /// The report as one JSON object (`loadtest --json`).
    public func json() -> String {
        var writer = JSONWriter(capacity: 4096)
        writer.beginObject()
        writer.field("run_id", runID)
        writer.field("passed", passed)
        writer.field("failures", failures)
        writer.key("offered")
        writer.beginObject()
        writer.field("from_rate", schedule.from)
        writer.field("to_rate", schedule.to)
        writer.field("duration_s", durationSeconds)
        writer.field("rate", offeredRate)
        writer.endObject()
        writer.field("sent", sent)
        writer.field("acknowledged", acknowledged)
        writer.field("produce_errors", produceErrors)
        writer.field("valid_sent", validSent)
        writer.field("duplicates_sent", duplicatesSent)
        writer.field("invalid_sent", invalidSent)
        writer.field("answered", answered)
        writer.field("achieved_rate", achievedRate)
        writer.field("missing", missing)
        writer.field("missing_examples", missingExamples)
        writer.field("duplicate_outcomes", duplicateOutcomes)
        writer.key("results")
        writer.beginObject()
        for (result, count) in results.sorted(by: { $0.key < $1.key }) {
            writer.key(dynamic: result)
            writer.integer(Int64(count))
        }
        writer.endObject()
        writer.key("in_doubt")
        writer.beginObject()
        writer.field("opened", inDoubt.opened)
        writer.field("resolved", inDoubt.resolved)
        writer.field("open", inDoubt.open)
        writer.endObject()
        writer.field("dead_letters", deadLetters)
        writer.key("latency_ms")
        writer.beginObject()
        for (name, percentile) in [("p50", 50.0), ("p90", 90), ("p99", 99), ("p99.9", 99.9)] {
            writer.key(dynamic: name)
            writer.number(Self.milliseconds(latency, percentile))
        }
        writer.field("max", Double(latency.maxValue) / 1000)
        writer.endObject()
        // A ramp's knee (with knee_reached_end when no window passed the bound); null otherwise.
        writer.key("knee_rate")
        if isRamp, let knee { writer.number(knee.rate) } else { writer.null() }
        writer.field("knee_reached_end", isRamp && knee?.reachedEnd == true)
        writer.field("knee_bound_ms", kneeBoundMs)
        writer.objects("windows", windows) { writer, window in
            writer.field("start_s", window.start)
            writer.field("length_s", window.length)
            writer.field("partial", window.partial)
            writer.field("offered_rate", window.offeredRate)
            writer.field("sent", window.sent)
            writer.field("valid_sent", window.validSent)
            writer.field("answered_of_sent", Int(window.ofSent.totalCount))
            writer.field("answered", window.answered)
            writer.field("dead_letters", window.deadLetters)
            writer.field("p99_ms", Self.milliseconds(window.seen, 99))
            writer.field("p99_ms_of_sent", Self.milliseconds(window.ofSent, 99))
        }
        writer.endObject()
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    /// The latencies of each window (outcomes seen in it) in HdrHistogram's log format.
    public func hdrLog() -> String {
        HdrHistogram.log(
            intervals: windows.map { ($0.start, $0.length, $0.seen) }, startedAt: startedAt)
    }

    /// A self-contained HTML page: the figures and inline SVG charts (latency against offered rate
    /// only when the rate varied).
    public func html() -> String {
        var page = HTMLReport(title: "Load test \(runID)")
        page.paragraph(
            passed ? "SLO held" : "SLO failed: \(failures.joined(separator: "; "))", className: passed ? "good" : "bad")
        page.table(
            [
                ["figure", "value"],
                ["offered", offeredDescription + String(format: " (%d requests, %.1f/s)", sent, offeredRate)],
                ["answered", String(format: "%d of %d valid, %.1f/s achieved", answered, validSent, achievedRate)],
                ["missing outcomes", "\(missing)"], ["duplicate outcomes", "\(duplicateOutcomes)"],
                ["results", resultsDescription], ["dead letters", "\(deadLetters)"],
                [
                    "latency",
                    String(
                        format: "p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms", Self.milliseconds(latency, 50),
                        Self.milliseconds(latency, 90), Self.milliseconds(latency, 99),
                        Double(latency.maxValue) / 1000),
                ],
                ["knee", kneeDescription],
            ], id: "figures")
        page.lineChart(
            id: "rate", title: "Offered and achieved rate", xLabel: "seconds", yLabel: "requests/s", lines: rateLines)
        page.lineChart(
            id: "latency", title: "Latency percentiles of the outcomes seen", xLabel: "seconds", yLabel: "ms",
            lines: [("p50", 50.0), ("p90", 90), ("p99", 99)].map { name, percentile in
                HTMLReport.Line(
                    name,
                    windows.filter { $0.seen.totalCount > 0 }.map {
                        (Self.middle(of: $0), Self.milliseconds($0.seen, percentile))
                    })
            })
        let kinds = Set(windows.flatMap(\.results.keys)).sorted()
        page.stackedColumns(
            id: "outcomes", title: "Outcomes seen per window, by result",
            columns: windows.map {
                HTMLReport.number(($0.start * 100).rounded() / 100) + " s" + ($0.partial ? "*" : "")
            },
            series: kinds.map { kind in (kind, windows.map { Double($0.results[kind] ?? 0) }) })
        if let partial = windows.last, partial.partial {
            page.paragraph(
                String(
                    format: "* The run ended %.1f s into its last window: its rates are over that part.", partial.length
                ))
        }
        if let omitted = latencyAgainstOfferedRateOmitted {
            page.paragraph(omitted)
        } else {
            let measured = productionWindows.filter { $0.ofSent.totalCount > 0 }
            page.lineChart(
                id: "knee", title: "Latency against offered rate (requests produced in each window)",
                xLabel: "offered requests/s", yLabel: "ms",
                lines: [
                    HTMLReport.Line("p50", measured.map { ($0.offeredRate, Self.milliseconds($0.ofSent, 50)) }),
                    HTMLReport.Line("p99", measured.map { ($0.offeredRate, Self.milliseconds($0.ofSent, 99)) }),
                ])
        }
        return page.html()
    }

    /// Where a window's points go on a time axis: the middle of the part the run lasted.
    static func middle(of window: LoadTest.Window) -> Double { window.start + window.length / 2 }

    /// The rate chart's lines: offered over the windows of production, achieved over the whole
    /// windows, and a partial last window dashed and named apart: over its own length it is no fall.
    var rateLines: [HTMLReport.Line] {
        let whole = windows.filter { !$0.partial }
        var lines = [
            HTMLReport.Line("offered", productionWindows.map { (Self.middle(of: $0), $0.offeredRate) }),
            HTMLReport.Line("achieved", whole.map { (Self.middle(of: $0), $0.achievedRate) }),
        ]
        if let last = windows.last, last.partial {
            let from = whole.last.map { [(Self.middle(of: $0), $0.achievedRate)] } ?? []
            lines.append(
                HTMLReport.Line(
                    String(format: "achieved in the last window (partial: %.1f s)", last.length),
                    from + [(Self.middle(of: last), last.achievedRate)], dashed: true, colour: 1))
        }
        return lines
    }

    /// Why latency against offered rate is left out (its points would stand on one or two vertical
    /// lines when the offered rate took fewer than three values, as in a steady run); `nil` when drawn.
    var latencyAgainstOfferedRateOmitted: String? {
        let rates = Set(productionWindows.filter { $0.ofSent.totalCount > 0 }.map { $0.offeredRate.rounded() })
        guard rates.count < 3 else { return nil }
        let values = rates.sorted().map { HTMLReport.number($0) + "/s" }.joined(separator: " and ")
        return rates.isEmpty
            ? "Latency against offered rate is left out: no request produced was answered."
            : "Latency against offered rate is left out: the offered rate took only \(values), so its points would stand on \(rates.count == 1 ? "one vertical line" : "two vertical lines"); latency over time is above."
    }
}
