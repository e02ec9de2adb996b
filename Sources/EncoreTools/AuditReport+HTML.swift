import EncoreEvents

extension AuditReport {
    /// Ids of the charts of ``html(title:)``, in the order they appear.
    public static let chartIDs = [
        "outcomes-per-minute", "latency-histogram", "dead-letters-by-class", "changes-by-kind",
    ]

    /// The self-contained HTML report: summary, charts, and every discrepancy's examples.
    public func html(title: String = "encore-processor audit") -> String {
        var page = HTMLReport(title: title)
        page.paragraph(
            failures == 0 ? "No discrepancies." : "\(failures) discrepancies.",
            className: failures == 0 ? "good" : "bad")
        page.heading("Summary")
        var summary = [["", "count"]]
        for discrepancy in Discrepancy.allCases { summary.append([discrepancy.rawValue, String(count(discrepancy))]) }
        page.table(summary, id: "summary")
        page.table(
            [
                ["figure", "value"], ["requests", String(figures.requests)],
                ["re-sent request ids", String(figures.resentRequests)],
                ["request_id conflicts", String(figures.requestIDConflicts)],
                [
                    "in doubt: opened / resolved / expired / open",
                    "\(figures.inDoubtOpened) / \(figures.inDoubtResolved) / \(figures.inDoubtExpired) / \(figures.inDoubtOpen)",
                ],
                ["load-test requests by run", Self.inline(figures.loadTestRequests)],
                ["outcomes", String(figures.outcomes)],
                ["outcomes by result", Self.inline(figures.outcomesByResult)],
                ["outcomes by controller", Self.inline(figures.outcomesByController)],
                ["dead letters by stage", Self.inline(figures.deadLettersByStage)],
                [
                    "latency p50 / p90 / p99 / max",
                    "\(figures.latencyMs.percentile(0.5)) / \(figures.latencyMs.percentile(0.9)) / \(figures.latencyMs.percentile(0.99)) / \(figures.latencyMs.max) ms",
                ],
            ], id: "figures")
        page.heading("Charts")
        outcomesPerMinute(into: &page)
        let bins = figures.latencyBins
        let lastBin = bins.lastIndex { $0 > 0 } ?? 0
        page.barChart(
            id: Self.chartIDs[1], title: "Request → outcome latency", unit: "",
            bars: (0...lastBin).map { bin in
                (bin == 0 ? "< 1 ms" : "\(1 << (bin - 1))–\(1 << bin) ms", Double(bins[bin]))
            })
        page.barChart(
            id: Self.chartIDs[2], title: "Dead letters by class", unit: "",
            bars: figures.deadLettersByClass.sorted { $0.key < $1.key }.map { ($0.key, Double($0.value)) })
        page.barChart(
            id: Self.chartIDs[3], title: "Entitlement changes by kind", unit: "",
            bars: figures.changesByKind.sorted { $0.key < $1.key }.map { ($0.key, Double($0.value)) })
        page.heading("Discrepancies")
        for discrepancy in Discrepancy.allCases where count(discrepancy) > 0 {
            page.paragraph(
                "\(discrepancy.rawValue): \(count(discrepancy))"
                    + (count(discrepancy) > Self.examplesPerDiscrepancy
                        ? " (the first \(Self.examplesPerDiscrepancy) shown)" : ""))
            page.table(
                [["request", "user", "topic", "partition", "offset", "detail"]]
                    + (examples[discrepancy] ?? []).map { example in
                        [
                            example.requestID ?? "-", example.user ?? "-", example.at.topic,
                            String(example.at.partition), example.at.offset < 0 ? "-" : String(example.at.offset),
                            example.detail ?? "",
                        ]
                    }, id: discrepancy.rawValue)
        }
        if failures == 0 { page.paragraph("None.") }
        return page.html()
    }

    /// Outcomes per minute by result, in at most 120 columns (wider buckets for long ranges).
    private func outcomesPerMinute(into page: inout HTMLReport) {
        let minutes = figures.outcomesPerMinute.keys.sorted()
        guard let first = minutes.first, let last = minutes.last else {
            page.stackedColumns(id: Self.chartIDs[0], title: "Outcomes per minute by result", columns: [], series: [])
            return
        }
        let width = max(1, (last - first + 1 + 119) / 120)
        let columns = Int((last - first) / width) + 1
        var series = OutcomeResult.allCases.map { (name: $0.rawValue, values: [Double](repeating: 0, count: columns)) }
        for (minute, counts) in figures.outcomesPerMinute {
            let column = Int((minute - first) / width)
            for (index, result) in OutcomeResult.allCases.enumerated() {
                series[index].values[column] += Double(counts[result] ?? 0)
            }
        }
        let labels = (0..<columns).map { column in
            String(CloudEventHeaders.rfc3339(ms: (first + Int64(column) * width) * 60_000).dropFirst(11).prefix(5))
        }
        page.stackedColumns(
            id: Self.chartIDs[0],
            title: width == 1 ? "Outcomes per minute by result" : "Outcomes per \(width) minutes by result",
            columns: labels, series: series)
    }
}
