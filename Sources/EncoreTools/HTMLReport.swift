/// A self-contained HTML page (no external assets) with inline SVG charts: what the audit and
/// load-test reports are written with. The output is well-formed XML after its doctype, so any
/// XML parser can check it.
public struct HTMLReport: Sendable {
    private var body: [String] = []
    private let title: String

    /// Colours of the series, in order.
    static let palette = ["#2f6fbb", "#d9822b", "#3a9a5b", "#c23b3b", "#8a5cc2", "#7a7a7a", "#c2a83b", "#3bb3c2"]

    public init(title: String) {
        self.title = title
    }

    /// Escapes text for an element or an attribute.
    public static func escape(_ text: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(text.utf8.count)
        for character in text {
            switch character {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    public mutating func heading(_ text: String) {
        body.append("<h2>\(Self.escape(text))</h2>")
    }

    public mutating func paragraph(_ text: String, className: String? = nil) {
        body.append("<p\(className.map { " class=\"\($0)\"" } ?? "")>\(Self.escape(text))</p>")
    }

    /// A table: the first row is the header.
    public mutating func table(_ rows: [[String]], id: String? = nil) {
        guard let header = rows.first else { return }
        var html = "<table\(id.map { " id=\"\($0)\"" } ?? "")><thead><tr>"
        html += header.map { "<th>\(Self.escape($0))</th>" }.joined()
        html += "</tr></thead><tbody>"
        for row in rows.dropFirst() {
            html += "<tr>" + row.map { "<td>\(Self.escape($0))</td>" }.joined() + "</tr>"
        }
        body.append(html + "</tbody></table>")
    }

    /// Horizontal bars, one per label.
    public mutating func barChart(id: String, title: String, unit: String, bars: [(label: String, value: Double)]) {
        let rowHeight = 22.0
        let labelWidth = 220.0
        let width = 720.0
        let height = max(1, Double(bars.count)) * rowHeight + 30
        let top = bars.map(\.value).max() ?? 0
        var svg = open(id: id, title: title, width: width, height: height)
        if bars.isEmpty { svg += text(x: 10, y: 40, "nothing to show", anchor: "start") }
        for (index, bar) in bars.enumerated() {
            let y = 24 + Double(index) * rowHeight
            let length = top > 0 ? (width - labelWidth - 80) * bar.value / top : 0
            svg += text(x: labelWidth - 6, y: y + 14, bar.label, anchor: "end")
            svg += rect(x: labelWidth, y: y + 2, width: length, height: rowHeight - 6, colour: Self.palette[0])
            svg += text(x: labelWidth + length + 6, y: y + 14, Self.number(bar.value) + unit, anchor: "start")
        }
        body.append(svg + "</svg>")
    }

    /// Columns stacked by series (e.g. outcomes per minute by result), with a legend.
    public mutating func stackedColumns(
        id: String, title: String, columns: [String], series: [(name: String, values: [Double])]
    ) {
        let width = 720.0
        let height = 300.0
        let (left, bottom, top) = (50.0, 40.0, 44.0)
        let plotHeight = height - bottom - top
        let totals = columns.indices.map { column in series.reduce(0) { $0 + $1.values[column] } }
        let highest = max(1, totals.max() ?? 0)
        let columnWidth = (width - left - 10) / max(1, Double(columns.count))
        var svg = open(id: id, title: title, width: width, height: height)
        svg += legend(series.map(\.name), y: 34)
        svg += text(x: left - 6, y: top + 10, Self.number(highest), anchor: "end")
        svg += text(x: left - 6, y: height - bottom, "0", anchor: "end")
        svg +=
            "<line x1=\"\(left)\" y1=\"\(height - bottom)\" x2=\"\(width - 10)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        for column in columns.indices {
            var base = height - bottom
            let x = left + Double(column) * columnWidth
            for (index, item) in series.enumerated() where item.values[column] > 0 {
                let size = plotHeight * item.values[column] / highest
                base -= size
                svg += rect(
                    x: x + 1, y: base, width: max(1, columnWidth - 2), height: size,
                    colour: Self.palette[index % Self.palette.count])
            }
        }
        // About six labels along the axis.
        let step = max(1, columns.count / 6)
        for column in stride(from: 0, to: columns.count, by: step) {
            svg += text(
                x: left + (Double(column) + 0.5) * columnWidth, y: height - bottom + 16, columns[column],
                anchor: "middle")
        }
        body.append(svg + "</svg>")
    }

    /// Lines through points (x, y), one per series, with a legend and both axes' ranges labelled
    /// (e.g. offered and achieved rate over time, latency against offered rate).
    public mutating func lineChart(
        id: String, title: String, xLabel: String, yLabel: String,
        series: [(name: String, points: [(x: Double, y: Double)])]
    ) {
        let width = 720.0
        let height = 300.0
        let (left, right, bottom, top) = (60.0, 14.0, 44.0, 44.0)
        let points = series.flatMap(\.points)
        let (lowX, highX) = (
            points.map(\.x).min() ?? 0, max(points.map(\.x).max() ?? 1, (points.map(\.x).min() ?? 0) + 1)
        )
        let highY = max(1, points.map(\.y).max() ?? 0)
        func position(_ point: (x: Double, y: Double)) -> String {
            let x = left + (width - left - right) * (point.x - lowX) / (highX - lowX)
            let y = height - bottom - (height - bottom - top) * point.y / highY
            return "\(Self.coordinate(x)),\(Self.coordinate(y))"
        }
        var svg = open(id: id, title: title, width: width, height: height)
        svg += legend(series.map(\.name), y: 34)
        if points.isEmpty { svg += text(x: 10, y: 70, "nothing to show", anchor: "start") }
        svg += text(x: left - 6, y: top + 10, Self.number(highY), anchor: "end")
        svg += text(x: left - 6, y: height - bottom, "0", anchor: "end")
        svg += text(x: 14, y: top - 4, yLabel, anchor: "start")
        svg += text(x: left, y: height - bottom + 16, Self.number(lowX), anchor: "start")
        svg += text(x: width - right, y: height - bottom + 16, Self.number(highX), anchor: "end")
        svg += text(x: (left + width - right) / 2, y: height - bottom + 32, xLabel, anchor: "middle")
        svg +=
            "<line x1=\"\(left)\" y1=\"\(height - bottom)\" x2=\"\(width - right)\" y2=\"\(height - bottom)\" stroke=\"#999\"/>"
        for (index, item) in series.enumerated() where !item.points.isEmpty {
            let colour = Self.palette[index % Self.palette.count]
            svg +=
                "<polyline fill=\"none\" stroke=\"\(colour)\" stroke-width=\"2\" points=\"\(item.points.map(position).joined(separator: " "))\"/>"
        }
        body.append(svg + "</svg>")
    }

    /// The page.
    public func html() -> String {
        """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"/><title>\(Self.escape(title))</title>
        <style>
        body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:960px}
        table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
        th{background:#f2f2f2}svg{display:block;margin:1em 0;background:#fafafa;border:1px solid #eee}
        svg text{font:12px system-ui,sans-serif}.bad{color:#c23b3b;font-weight:bold}.good{color:#3a9a5b;font-weight:bold}
        </style></head>
        <body><h1>\(Self.escape(title))</h1>
        \(body.joined(separator: "\n"))
        </body></html>

        """
    }

    // MARK: SVG pieces

    private func open(id: String, title: String, width: Double, height: Double) -> String {
        "<svg id=\"\(Self.escape(id))\" xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\"><title>\(Self.escape(title))</title>"
            + text(x: 10, y: 16, title, anchor: "start", bold: true)
    }

    private func legend(_ names: [String], y: Double) -> String {
        var svg = ""
        var x = 50.0
        for (index, name) in names.enumerated() {
            svg += rect(x: x, y: y - 9, width: 10, height: 10, colour: Self.palette[index % Self.palette.count])
            svg += text(x: x + 14, y: y, name, anchor: "start")
            x += 24 + Double(name.count) * 7
        }
        return svg
    }

    private func rect(x: Double, y: Double, width: Double, height: Double, colour: String) -> String {
        "<rect x=\"\(Self.coordinate(x))\" y=\"\(Self.coordinate(y))\" width=\"\(Self.coordinate(width))\" height=\"\(Self.coordinate(height))\" fill=\"\(colour)\"/>"
    }

    private func text(x: Double, y: Double, _ content: String, anchor: String, bold: Bool = false) -> String {
        "<text x=\"\(Self.coordinate(x))\" y=\"\(Self.coordinate(y))\" text-anchor=\"\(anchor)\"\(bold ? " font-weight=\"bold\"" : "")>\(Self.escape(content))</text>"
    }

    private static func coordinate(_ value: Double) -> String {
        String(Double(Int((value * 10).rounded())) / 10)
    }

    /// A count or measure without a needless fraction.
    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String((value * 100).rounded() / 100)
    }
}
