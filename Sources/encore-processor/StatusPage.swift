import EncoreProcessor
import EncoreTools
import Foundation

/// `GET /`: the status page, one self-contained HTML document (no script, no external asset)
/// that reloads itself every ``refreshSeconds``. Every number it shows carries
/// `data-status="<path>"`, the path of the same number in `/status`, so a test can compare the two.
enum StatusPage {
    static let refreshSeconds = 5

    static func html(_ status: ProcessorStatus) -> String {
        var body = ""
        let state = status.ready ? "ready" : status.alive ? "alive, not ready" : "not alive"
        body += "<h1>encore-processor <span data-status=\"version\">\(escape(status.version))</span></h1>\n"
        body += "<p class=\"\(status.ready ? "ok" : "bad")\">\(state)"
        for reason in status.reasons { body += " · \(escape(reason))" }
        body += "</p>\n<p>group \(escape(status.group)), instance \(escape(status.instance)), "
        body += "\(escape(status.guarantee)), librdkafka \(escape(status.librdkafka)), up "
        body += number(status.uptimeSeconds, "uptime_seconds", decimals: 0) + " s</p>\n"

        body += "<h2>Requests</h2>\n<table>\n"
        body += row("received", number(status.requestsReceived, "requests_received"))
        body += row("calls in flight", number(status.callsInFlight, "calls_in_flight"))
        body += row("records buffered", number(status.bufferedRecords, "buffered_records"))
        for outcome in status.outcomes {
            body += row("outcome \(outcome.name)", number(outcome.count, "outcomes.\(outcome.name)"))
        }
        body += "</table>\n<h2>In doubt</h2>\n<table>\n"
        body += row("open now", number(status.inDoubt.open, "in_doubt.open"))
        body += row("oldest (s)", number(status.inDoubt.oldestAgeSeconds, "in_doubt.oldest_age_seconds", decimals: 1))
        body += row("opened", number(status.inDoubt.opened, "in_doubt.opened"))
        body += row("resolved", number(status.inDoubt.resolved, "in_doubt.resolved"))
        body += row("expired", number(status.inDoubt.expired, "in_doubt.expired"))
        body += "</table>\n<h2>Partitions owned</h2>\n"
        body += table(
            status.partitions.map { partition in
                let path = "partitions.\(partition.topic)/\(partition.partition)"
                let percent = Int((partition.progress * 100).rounded(.down))
                var row = "<tr><td>\(escape(partition.topic))/\(partition.partition)</td>"
                row += "<td>" + (partition.lag.map { number(Int($0), "\(path).lag") } ?? "-") + "</td>"
                row += "<td>" + number(Int(partition.nextOffset), "\(path).next_offset") + "</td>"
                row += "<td>" + number(Int(partition.highWatermark), "\(path).high_watermark") + "</td>"
                row += "<td><progress max=\"100\" value=\"\(percent)\"></progress> \(percent)%</td>"
                return row + "<td>\(escape(partition.fetchState))</td></tr>\n"
            }, header: "<tr><th>partition</th><th>lag</th><th>next</th><th>end</th><th>read</th><th>fetch</th></tr>\n")
        body += "<h2>Dead letters by reason</h2>\n"
        body += table(status.deadLetters.map { row($0.name, number($0.count, "dead_letters.\($0.name)")) })
        body += "<h2>Rebalances</h2>\n<table>\n"
        body += row("assigned", number(status.rebalances.assigned, "rebalances.assigned"))
        body += row("revoked", number(status.rebalances.revoked, "rebalances.revoked"))
        body += row("restores", number(status.rebalances.restores, "rebalances.restores"))
        body += row(
            "restore time (s)", number(status.rebalances.restoreSeconds, "rebalances.restore_seconds", decimals: 2))
        body += "</table>\n<h2>Process</h2>\n<table>\n"
        body += row("CPU (s)", number(status.cpuSeconds, "cpu_seconds", decimals: 2))
        body += row("resident memory (bytes)", number(status.residentBytes, "resident_bytes"))
        body += "</table>\n<h2>Last warnings and errors</h2>\n"
        body += table(
            status.lastErrors.map { entry in
                "<tr><td>\(escape(entry.time))</td><td>\(escape(entry.level))</td>"
                    + "<td>\(escape(entry.logger))</td><td>\(escape(entry.message))</td></tr>\n"
            }, className: "log")
        return """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8">
            <meta http-equiv="refresh" content="\(refreshSeconds)">
            <title>encore-processor status</title>
            <link rel="icon" href="data:,">
            <style>
            body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
            table{border-collapse:collapse;margin-bottom:1em}
            td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
            td[data-status],span[data-status]{font-variant-numeric:tabular-nums}
            .ok{color:#176317}.bad{color:#a11}.log td{font-family:monospace;font-size:12px}
            .log td:first-child{white-space:nowrap}
            </style></head><body>
            \(body)<p>Reloads every \(refreshSeconds) s. The same data as JSON: <a href="/status">/status</a>; \
            metrics: <a href="/metrics">/metrics</a>.</p>
            </body></html>

            """
    }

    private static func escape(_ text: String) -> String { HTMLReport.escape(text) }

    /// `rows` as a table (after `header`), or "none".
    private static func table(_ rows: [String], header: String = "", className: String? = nil) -> String {
        guard !rows.isEmpty else { return "<p>none</p>\n" }
        let opening = className.map { "<table class=\"\($0)\">\n" } ?? "<table>\n"
        return opening + header + rows.joined() + "</table>\n"
    }

    private static func row(_ label: String, _ value: String) -> String {
        "<tr><th>\(escape(label))</th><td>\(value)</td></tr>\n"
    }

    /// A number as shown, tagged with its path in `/status`.
    private static func number(_ value: Int, _ path: String) -> String {
        "<span data-status=\"\(escape(path))\">\(value)</span>"
    }

    private static func number(_ value: Double, _ path: String, decimals: Int) -> String {
        "<span data-status=\"\(escape(path))\">\(String(format: "%.\(decimals)f", value))</span>"
    }
}
