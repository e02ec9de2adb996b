import EncoreEvents
@testable import EncoreTools
import Foundation
import Testing

/// The load test's arithmetic without Kafka: the offered schedule, the histogram, the knee.
@Suite("Load test report")
struct LoadTestReportTests {
    @Test("a ramp's schedule offers the integral of its rate; a steady one rate × time")
    func schedule() {
        let ramp = RateSchedule(from: 100, to: 300, over: 10)
        #expect(
            ramp.rate(at: 0) == 100 && ramp.rate(at: 5) == 200 && ramp.rate(at: 10) == 300 && ramp.rate(at: 20) == 300)
        #expect(ramp.allowed(at: 10) == 2000)  // (100 + 300) / 2 × 10
        #expect(ramp.allowed(at: 12) == 2600)  // then 300/s
        #expect(RateSchedule(50).allowed(at: 6) == 300)
    }

    @Test("percentiles are within the histogram's precision; values past the range are clamped")
    func histogram() {
        var histogram = HdrHistogram(highest: 3_600_000_000, significantDigits: 3)
        for value in 1...10_000 { histogram.record(Int64(value)) }
        #expect(histogram.totalCount == 10_000 && histogram.maxValue == 10_000)
        for (percentile, exact) in [(50.0, 5_000.0), (90, 9_000), (99, 9_900)] {
            let value = Double(histogram.value(atPercentile: percentile))
            #expect(abs(value - exact) / exact < 0.001, "p\(percentile): \(value)")
        }
        histogram.record(Int64.max)
        #expect(histogram.maxValue == 3_600_000_000)
        var coarse = HdrHistogram(significantDigits: 2)
        coarse.record(123_456)
        #expect(abs(Double(coarse.value(atPercentile: 100)) - 123_456) / 123_456 < 0.01)
    }

    /// A window of 100 valid requests, `answered` of them answered at `p99Ms`.
    func window(_ index: Int, rate: Double, answered: Int = 100, ms: Int64) -> LoadTest.Window {
        var window = LoadTest.Window(start: Double(index) * 5, length: 5, offeredRate: rate)
        window.sent = 100
        window.validSent = 100
        for _ in 0..<answered { window.ofSent.record(ms * 1000) }
        return window
    }

    func report(_ windows: [LoadTest.Window], p99Ms: Double? = 250) -> LoadTestReport {
        var slo = LoadTest.SLO()
        slo.p99Ms = p99Ms
        return LoadTestReport(
            runID: "t", startedAt: Date(), schedule: RateSchedule(from: 100, to: 500, over: 20),
            durationSeconds: 20, productionSeconds: 20, sent: 400, acknowledged: 400, produceErrors: 0, validSent: 400,
            duplicatesSent: 0, invalidSent: 0, answered: 400, missing: 0, missingExamples: [], duplicateOutcomes: 0,
            results: [:], deadLetters: 0, latency: HdrHistogram(), windows: windows, lastAnsweredSeconds: 20, slo: slo)
    }

    @Test("the knee is the last window before the first whose p99 passed the bound or that lost a request")
    func knee() {
        let rising = [
            window(0, rate: 100, ms: 20), window(1, rate: 200, ms: 40), window(2, rate: 300, ms: 400),
            window(3, rate: 400, ms: 30),
        ]
        #expect(report(rising).knee?.rate == 200 && report(rising).knee?.reachedEnd == false)
        // Without an SLO p99 the bound is a second.
        #expect(report(rising, p99Ms: nil).knee?.rate == 400 && report(rising, p99Ms: nil).knee?.reachedEnd == true)
        // A window with a request unanswered ends the climb, however fast the rest were.
        let lossy = [window(0, rate: 100, ms: 20), window(1, rate: 200, answered: 99, ms: 20)]
        #expect(report(lossy).knee?.rate == 100)
        // Failing from the first window: no knee inside the ramp.
        #expect(report([window(0, rate: 100, ms: 900)]).knee == nil)
        // Duplicates and invalid records (no outcome of their own) do not count as unanswered.
        var mixed = window(0, rate: 100, answered: 90, ms: 20)
        mixed.validSent = 90
        #expect(report([mixed]).knee?.reachedEnd == true)
    }
}

@Suite("Load test report charts")
struct LoadTestReportChartTests {
    /// A steady 300/s run of `seconds` in windows of 5 s, every request answered.
    func steadyReport(seconds: Int) -> LoadTestReport {
        let windows = stride(from: 0, to: seconds, by: 5).map { start in
            var window = LoadTest.Window(start: Double(start), length: 5, offeredRate: 300)
            window.sent = 1500
            window.validSent = 1500
            window.answered = 1500
            window.results = ["purchased": 1500]
            for _ in 0..<1500 {
                window.seen.record(20_000)
                window.ofSent.record(20_000)
            }
            return window
        }
        return LoadTestReport(
            runID: "steady", startedAt: Date(), schedule: RateSchedule(300), durationSeconds: Double(seconds),
            productionSeconds: Double(seconds), sent: 300 * seconds, acknowledged: 300 * seconds, produceErrors: 0,
            validSent: 300 * seconds, duplicatesSent: 0, invalidSent: 0, answered: 300 * seconds, missing: 0,
            missingExamples: [], duplicateOutcomes: 0, results: ["purchased": 300 * seconds], deadLetters: 0,
            latency: HdrHistogram(), windows: windows, lastAnsweredSeconds: Double(seconds), slo: LoadTest.SLO())
    }

    @Test("a steady run has no latency-against-offered-rate chart (one x for every point), and says why")
    func steadyHasNoKneeChart() {
        let page = steadyReport(seconds: 20).html()
        #expect(!page.contains("<svg id=\"knee\""))
        #expect(page.contains("Latency against offered rate is left out"))
    }

    /// Windows of 2.5 s of a run that produced 300/s for 6 s and ended at `end`, its last outcomes
    /// seen at 6.05 s: as the tracker opened them, before the run closed them.
    func openWindows(upTo end: Double) -> [LoadTest.Window] {
        stride(from: 0.0, to: end, by: 2.5).map { start in
            var window = LoadTest.Window(start: start, length: 2.5, offeredRate: 300)
            let produced = max(0, min(2.5, 6 - start))
            window.sent = Int(300 * produced)
            window.validSent = window.sent
            window.answered = start < 6.05 ? max(15, window.sent) : 0
            return window
        }
    }

    @Test("the window the run ended in is cut to what the run lasted of it and marked partial; rates over that part")
    func partialWindow() {
        let windows = LoadTest.Window.closing(
            openWindows(upTo: 6.1), endedAt: 6.1, productionSeconds: 6, schedule: RateSchedule(300))
        #expect(windows.count == 3)
        #expect(windows.prefix(2).allSatisfy { !$0.partial && $0.length == 2.5 && $0.achievedRate == 300 })
        let last = windows[2]
        #expect(last.partial && abs(last.length - 1.1) < 1e-9)
        // 300 answered in the 1.1 s the run lasted of it, not 300 over 2.5 s.
        #expect(abs(last.achievedRate - 300 / 1.1) < 1e-9)
        // A window opened just as the run ended, with nothing in it, is no point of any chart.
        let empty = LoadTest.Window.closing(
            openWindows(upTo: 7.501), endedAt: 7.501, productionSeconds: 6, schedule: RateSchedule(300))
        #expect(empty.count == 3 && empty.allSatisfy { !$0.partial })
    }

    @Test("the achieved-rate line has no fall for a partial last window: it is drawn apart, dashed and named partial")
    func partialWindowInTheRateChart() {
        var report = steadyReport(seconds: 20)
        var last = report.windows[3]
        (last.length, last.partial, last.answered) = (0.2, true, 60)
        report.windows[3] = last
        let lines = report.rateLines
        let achieved = lines.first { $0.name == "achieved" }
        #expect(achieved?.points.count == 3)
        #expect(achieved?.points.allSatisfy { $0.y == 300 } == true)
        let partial = lines.first { $0.name.contains("partial") }
        #expect(partial?.dashed == true)
        #expect(partial?.points.last.map { abs($0.x - 15.1) < 1e-9 && $0.y == 300 } == true)
        #expect(lines.allSatisfy { $0.points.allSatisfy { $0.y > 0 } })
        #expect(report.html().contains("data-series=\"achieved in the last window (partial: 0.2 s)\""))
    }

    @Test("a ramp keeps its latency-against-offered-rate chart")
    func rampHasKneeChart() {
        var report = steadyReport(seconds: 20)
        for index in report.windows.indices { report.windows[index].offeredRate = 100 * Double(index + 1) }
        #expect(report.latencyAgainstOfferedRateOmitted == nil)
        #expect(report.html().contains("<svg id=\"knee\""))
    }
}
