/// Where the pieces of an axis chart go, computed before anything is drawn so that no label
/// covers another: the title, the legend (wrapped into rows), the y axis's label and range, the
/// plot, the x axis's range and label, top to bottom.
struct ChartLayout: Sendable {
    /// A rectangle of the chart, in SVG user units (y grows downwards).
    struct Box: Sendable, Equatable {
        var x: Double
        var y: Double
        var width: Double
        var height: Double

        var maxX: Double { x + width }
        var maxY: Double { y + height }

        func intersects(_ other: Box) -> Bool {
            x < other.maxX && other.x < maxX && y < other.maxY && other.y < maxY
        }
    }

    /// A text label: its baseline origin as SVG places it (`x` is where `anchor` puts it) and the
    /// box it takes.
    struct Label: Sendable, Equatable {
        var text: String
        var x: Double
        var baseline: Double
        var anchor: String
        var box: Box
    }

    /// A legend entry: its colour swatch and its name.
    struct LegendEntry: Sendable, Equatable {
        var swatch: Box
        var label: Label
    }

    /// The width a 12 px label takes per character, on the generous side of system fonts (the
    /// browser check measures the real boxes).
    static let characterWidth = 7.0
    /// A 12 px label's extent above and below its baseline.
    static let ascent = 11.0
    static let descent = 3.0

    let width: Double
    let height: Double
    let title: Label
    let legend: [LegendEntry]
    /// The y axis's name, its highest value and its 0.
    let yLabel: Label
    let yHigh: Label
    let yZero: Label
    /// The area the data is drawn in.
    let plot: Box
    /// The x axis's lowest and highest value (absent for columns, which label themselves) and name.
    let xLow: Label?
    let xHigh: Label?
    let xLabel: Label?

    /// `x` is `nil` for a chart of columns; `plotHeight` is the data's height whatever the legend takes.
    init(
        title titleText: String, legend names: [String], yLabel yName: String, yHigh highText: String,
        x: (low: String, high: String, label: String)?, width: Double = 720, plotHeight: Double = 200
    ) {
        self.width = width
        let right = 14.0
        // The y range's labels end 6 left of the plot.
        let left = max(50, 12 + Self.textWidth(highText))
        self.title = Self.label(titleText, x: 10, baseline: 16, anchor: "start")
        var legend: [LegendEntry] = []
        var (entryX, baseline) = (left, 36.0)
        for name in names {
            let entryWidth = 14 + Self.textWidth(name)
            if entryX > left, entryX + entryWidth > width - right {
                (entryX, baseline) = (left, baseline + 18)
            }
            legend.append(
                LegendEntry(
                    swatch: Box(x: entryX, y: baseline - 9, width: 10, height: 10),
                    label: Self.label(name, x: entryX + 14, baseline: baseline, anchor: "start")))
            entryX += entryWidth + 16
        }
        self.legend = legend
        // The y axis's name on a row of its own under the legend (none when it has no name), the plot under it.
        let yLabelBaseline = (names.isEmpty ? 16 : baseline) + (yName.isEmpty ? 0 : 20)
        yLabel = Self.label(yName, x: 10, baseline: yLabelBaseline, anchor: "start")
        let plot = Box(x: left, y: yLabelBaseline + 14, width: width - left - right, height: plotHeight)
        self.plot = plot
        yHigh = Self.label(highText, x: left - 6, baseline: plot.y + Self.ascent - 1, anchor: "end")
        yZero = Self.label("0", x: left - 6, baseline: plot.maxY, anchor: "end")
        if let x {
            xLow = Self.label(x.low, x: left, baseline: plot.maxY + 16, anchor: "start")
            xHigh = Self.label(x.high, x: plot.maxX, baseline: plot.maxY + 16, anchor: "end")
            xLabel = Self.label(x.label, x: plot.x + plot.width / 2, baseline: plot.maxY + 32, anchor: "middle")
        } else {
            (xLow, xHigh, xLabel) = (nil, nil, nil)
        }
        height = plot.maxY + 44
    }

    /// Every label and swatch: no two of them may intersect.
    var boxes: [Box] {
        [title.box, yLabel.box, yHigh.box, yZero.box] + [xLow, xHigh, xLabel].compactMap { $0?.box }
            + legend.flatMap { [$0.swatch, $0.label.box] }
    }

    static func textWidth(_ text: String) -> Double { Double(text.count) * characterWidth }

    static func label(_ text: String, x: Double, baseline: Double, anchor: String) -> Label {
        let width = textWidth(text)
        let left =
            switch anchor {
            case "end": x - width
            case "middle": x - width / 2
            default: x
            }
        return Label(
            text: text, x: x, baseline: baseline, anchor: anchor,
            box: Box(x: left, y: baseline - ascent, width: width, height: ascent + descent))
    }
}
