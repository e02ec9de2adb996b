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

    /// A line of ``lineChart(id:title:xLabel:yLabel:lines:)``; a dashed one shows a partial measure
    /// (such as a window the run ended in), apart from the whole ones.
    public struct Line: Sendable {
        public var name: String
        public var points: [(x: Double, y: Double)]
        public var dashed: Bool
        /// Index in the palette (by default the line's own index).
        public var colour: Int?

        public init(_ name: String, _ points: [(x: Double, y: Double)], dashed: Bool = false, colour: Int? = nil) {
            self.name = name
            self.points = points
            self.dashed = dashed
            self.colour = colour
        }
    }

    /// Horizontal bars, one per label, each labelled with its value.
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
            svg += text(
                x: labelWidth + length + 6, y: y + 14, Self.number(bar.value) + unit, anchor: "start",
                className: "value")
        }
        body.append(svg + "</svg>")
    }

    /// Columns stacked by series (e.g. outcomes per minute by result), with a legend.
    public mutating func stackedColumns(
        id: String, title: String, columns: [String], series: [(name: String, values: [Double])]
    ) {
        let totals = columns.indices.map { column in series.reduce(0) { $0 + $1.values[column] } }
        let highest = max(1, totals.max() ?? 0)
        let layout = ChartLayout(
            title: title, legend: series.map(\.name), yLabel: "", yHigh: Self.number(highest), x: nil)
        let plot = layout.plot
        let columnWidth = plot.width / max(1, Double(columns.count))
        var svg = open(id: id, layout: layout)
        svg += legend(layout, colours: series.indices.map { $0 }, dashed: series.map { _ in false })
        svg += axes(layout)
        for column in columns.indices {
            var base = plot.maxY
            let x = plot.x + Double(column) * columnWidth
            for (index, item) in series.enumerated() where item.values[column] > 0 {
                let size = plot.height * item.values[column] / highest
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
                x: plot.x + (Double(column) + 0.5) * columnWidth, y: plot.maxY + 16, columns[column], anchor: "middle")
        }
        body.append(svg + "</svg>")
    }

    /// Lines through points (x, y), each point marked, with a legend and both axes' ranges labelled
    /// (e.g. offered and achieved rate over time, latency against offered rate).
    public mutating func lineChart(id: String, title: String, xLabel: String, yLabel: String, lines: [Line]) {
        let points = lines.flatMap(\.points)
        let lowX = points.map(\.x).min() ?? 0
        let highX = max(points.map(\.x).max() ?? 1, lowX + 1)
        let highY = max(1, points.map(\.y).max() ?? 0)
        let layout = ChartLayout(
            title: title, legend: lines.map(\.name), yLabel: yLabel, yHigh: Self.number(highY),
            x: (Self.number(lowX), Self.number(highX), xLabel))
        let plot = layout.plot
        func position(_ point: (x: Double, y: Double)) -> (x: Double, y: Double) {
            (plot.x + plot.width * (point.x - lowX) / (highX - lowX), plot.maxY - plot.height * point.y / highY)
        }
        let colours = lines.enumerated().map { $1.colour ?? $0 }
        var svg = open(id: id, layout: layout)
        svg += legend(layout, colours: colours, dashed: lines.map(\.dashed))
        svg += axes(layout)
        if points.isEmpty { svg += text(x: plot.x + 10, y: plot.y + 20, "nothing to show", anchor: "start") }
        for (line, colourIndex) in zip(lines, colours) where !line.points.isEmpty {
            let colour = Self.palette[colourIndex % Self.palette.count]
            let at = line.points.map(position)
            svg +=
                "<polyline data-series=\"\(Self.escape(line.name))\" fill=\"none\" stroke=\"\(colour)\" stroke-width=\"2\"\(line.dashed ? " stroke-dasharray=\"6,4\"" : "") points=\"\(at.map { "\(Self.coordinate($0.x)),\(Self.coordinate($0.y))" }.joined(separator: " "))\"/>"
            for point in at {
                svg +=
                    "<circle cx=\"\(Self.coordinate(point.x))\" cy=\"\(Self.coordinate(point.y))\" r=\"3\" fill=\"\(line.dashed ? "#fff" : colour)\" stroke=\"\(colour)\" stroke-width=\"1.5\"/>"
            }
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

    private func open(id: String, layout: ChartLayout) -> String {
        open(id: id, title: layout.title.text, width: layout.width, height: layout.height)
    }

    /// A swatch and a name per entry; a dashed line's swatch is hollow and dashed.
    private func legend(_ layout: ChartLayout, colours: [Int], dashed: [Bool]) -> String {
        var svg = ""
        for (entry, (colourIndex, dashed)) in zip(layout.legend, zip(colours, dashed)) {
            let colour = Self.palette[colourIndex % Self.palette.count]
            let box = entry.swatch
            svg +=
                "<rect class=\"swatch\" x=\"\(Self.coordinate(box.x))\" y=\"\(Self.coordinate(box.y))\" width=\"\(Self.coordinate(box.width))\" height=\"\(Self.coordinate(box.height))\" "
                + (dashed ? "fill=\"#fff\" stroke=\"\(colour)\" stroke-dasharray=\"2,2\"/>" : "fill=\"\(colour)\"/>")
            svg += text(entry.label)
        }
        return svg
    }

    /// The y axis's name and range, the x axis's range and name, and the x axis.
    private func axes(_ layout: ChartLayout) -> String {
        var svg = [layout.yLabel, layout.yHigh, layout.yZero].map(text).joined()
        svg += [layout.xLow, layout.xHigh, layout.xLabel].compactMap { $0.map(text) }.joined()
        let plot = layout.plot
        return svg
            + "<line x1=\"\(Self.coordinate(plot.x))\" y1=\"\(Self.coordinate(plot.maxY))\" x2=\"\(Self.coordinate(plot.maxX))\" y2=\"\(Self.coordinate(plot.maxY))\" stroke=\"#999\"/>"
    }

    private func rect(x: Double, y: Double, width: Double, height: Double, colour: String) -> String {
        "<rect x=\"\(Self.coordinate(x))\" y=\"\(Self.coordinate(y))\" width=\"\(Self.coordinate(width))\" height=\"\(Self.coordinate(height))\" fill=\"\(colour)\"/>"
    }

    private func text(
        x: Double, y: Double, _ content: String, anchor: String, bold: Bool = false, className: String? = nil
    ) -> String {
        "<text\(className.map { " class=\"\($0)\"" } ?? "") x=\"\(Self.coordinate(x))\" y=\"\(Self.coordinate(y))\" text-anchor=\"\(anchor)\"\(bold ? " font-weight=\"bold\"" : "")>\(Self.escape(content))</text>"
    }

    private func text(_ label: ChartLayout.Label) -> String {
        label.text.isEmpty ? "" : text(x: label.x, y: label.baseline, label.text, anchor: label.anchor)
    }

    private static func coordinate(_ value: Double) -> String {
        String(Double(Int((value * 10).rounded())) / 10)
    }

    /// A count or measure without a needless fraction.
    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String((value * 100).rounded() / 100)
    }
}
