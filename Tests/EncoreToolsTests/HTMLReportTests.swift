@testable import EncoreTools
import Foundation
import Testing

/// A label of a rendered chart and the box it takes, estimated as the renderer estimates a 12 px
/// label (``ChartLayout/characterWidth`` per character, 11 px above the baseline, 3 below).
struct RenderedLabel: CustomStringConvertible {
    let text: String
    let box: (x: Double, y: Double, width: Double, height: Double)

    var description: String { "'\(text)' at \(box)" }

    func overlaps(_ other: RenderedLabel) -> Bool {
        box.x < other.box.x + other.box.width && other.box.x < box.x + box.width
            && box.y < other.box.y + other.box.height && other.box.y < box.y + box.height
    }

    /// The labels (text) and legend swatches (10 × 10 rects) of the chart `id` in `page`.
    static func all(in page: String, chart id: String) -> [RenderedLabel] {
        guard
            let svg = page.components(separatedBy: "<svg id=\"\(id)\"").dropFirst().first?
                .components(separatedBy: "</svg>").first
        else { return [] }
        func attribute(_ name: String, _ element: String) -> String? {
            guard let start = element.range(of: " \(name)=\"") else { return nil }
            return String(element[start.upperBound...].prefix { $0 != "\"" })
        }
        var labels: [RenderedLabel] = []
        for piece in svg.components(separatedBy: "<text ").dropFirst() {
            let element = " " + piece.prefix { $0 != ">" }
            let text = piece.drop { $0 != ">" }.dropFirst().prefix { $0 != "<" }
            guard let x = attribute("x", element).flatMap(Double.init),
                let y = attribute("y", element).flatMap(Double.init)
            else { continue }
            let width = Double(text.count) * 7
            let left =
                switch attribute("text-anchor", element) {
                case "end": x - width
                case "middle": x - width / 2
                default: x
                }
            labels.append(RenderedLabel(text: String(text), box: (left, y - 11, width, 14)))
        }
        for piece in svg.components(separatedBy: "<rect ").dropFirst() {
            let element = " " + piece.prefix { $0 != ">" }
            guard attribute("width", element) == "10.0", attribute("height", element) == "10.0",
                let x = attribute("x", element).flatMap(Double.init),
                let y = attribute("y", element).flatMap(Double.init)
            else { continue }
            labels.append(RenderedLabel(text: "swatch", box: (x, y, 10, 10)))
        }
        return labels
    }
}

@Suite("HTML report charts")
struct HTMLReportTests {
    @Test(
        "no label of a line chart overlaps another: legend, axis labels and ranges",
        arguments: [
            ["offered", "achieved"], ["p50", "p90", "p99"],
            [
                "offered", "achieved", "achieved in the last window (partial: 0.4 s of 5 s)", "a fourth series",
                "a fifth",
            ],
        ])
    func labelsApart(names: [String]) {
        var page = HTMLReport(title: "t")
        page.lineChart(
            id: "chart", title: "A chart", xLabel: "seconds", yLabel: "requests/s",
            lines: names.enumerated().map { index, name in
                HTMLReport.Line(name, [(x: 0.0, y: 1234.0 * Double(index)), (x: 30, y: 4188)], dashed: index == 2)
            })
        let labels = RenderedLabel.all(in: page.html(), chart: "chart")
        #expect(labels.count >= 2 * names.count + 6)
        for (index, label) in labels.enumerated() {
            for other in labels[(index + 1)...] {
                #expect(!label.overlaps(other), "\(label) overlaps \(other)")
            }
        }
    }

    @Test(
        "the layout keeps the legend, the axes' labels and the plot in disjoint boxes, inside the chart",
        arguments: [
            (["offered", "achieved"], "requests/s", "4188"),
            (["cancelled", "failed", "pending", "purchased", "outcome_unknown", "rejected"], "", "12345678"),
            ((1...12).map { "a series named \($0)" }, "ms", "53.25"),
        ])
    func layoutApart(names: [String], yLabel: String, yHigh: String) {
        let layout = ChartLayout(
            title: "Offered and achieved rate", legend: names, yLabel: yLabel, yHigh: yHigh,
            x: ("1.25", "6.25", "seconds"))
        let boxes = layout.boxes.filter { $0.width > 0 }
        for (index, box) in boxes.enumerated() {
            #expect(box.x >= 0 && box.maxX <= layout.width && box.y >= 0 && box.maxY <= layout.height, "\(box)")
            #expect(!box.intersects(layout.plot) || box == layout.yZero.box, "\(box) inside the plot")
            for other in boxes[(index + 1)...] { #expect(!box.intersects(other), "\(box) and \(other)") }
        }
        #expect(layout.plot.height == 200, "the legend's rows take room above the plot, not from it")
    }
}
