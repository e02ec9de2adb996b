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
