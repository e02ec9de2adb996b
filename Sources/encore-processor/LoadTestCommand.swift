import EncoreEvents
import EncoreProcessor
import EncoreTools
import Foundation
import Kafka

/// `encore-processor loadtest`: offers generated load to a running deployment and measures it
/// from the outside (throughput, latency, missing outcomes, the knee of a ramp).
enum LoadTestCommand {
    static let definition = CommandDefinition(
        name: "loadtest",
        summary: "Offer generated load to a running deployment and measure its outcomes (exit 1 when the SLO fails).",
        usage:
            "loadtest --bootstrap-servers HOST:PORT (--rate R | --ramp R1:R2) --duration S [--slo p99=MS,missing=N] [--json] [--html FILE] [--hdr FILE] [options]",
        options: CommonOptions.kafka + GenerateCommand.generatorOptions + [
            .option("rate", value: "R", "Requests per second, steady."),
            .option("ramp", value: "R1:R2", "Requests per second rising linearly from R1 to R2 over --duration."),
            .option("duration", value: "S", "Seconds to produce for."),
            .option("grace", value: "S", default: "30", "Seconds to wait for outstanding outcomes after producing."),
            .option(
                "slo", value: "p99=MS,missing=N",
                "What must hold: p99 request-to-outcome latency at most MS (a steady run; a ramp's knee bound), at most N missing outcomes (default: none missing)."
            ),
            .option("window-s", value: "S", default: "5", "Seconds per window of the live lines and charts."),
            .option("seed", value: "N", default: "1", "Seed of the generated requests."),
            .option("requests-topic", value: "TOPIC", default: "encore.purchase-requests", "Topic to produce to."),
            .option(
                "outcomes-topic", value: "TOPIC", default: "encore.purchase-outcomes", "Topic of outcomes to read."),
            .option(
                "dead-letter-topic", value: "TOPIC", default: "encore.dead-letters", "Topic of dead letters to read."),
            .option("run-id", value: "ID", "Name of this run (default: random); marks its requests."),
            .flag("json", "Print nothing but one JSON object at the end."),
            .option("html", value: "FILE", "Also write a self-contained HTML report with charts to FILE."),
            .option(
                "hdr", value: "FILE", "Also write the latency histogram of each window in HdrHistogram's log format."),
            .flag("check", "Validate the arguments and exit.", commandLineOnly: true),
        ],
        discussion: """
            Produces generated requests (environment SANDBOX unless --environment says otherwise;
            attributes.encore_loadtest_run = the run id; request ids lt-<run id>-<seed>-<n>) at the
            offered rate into the requests topic of a running deployment, and reads the outcomes and
            dead-letter topics from their current ends without joining a group, matching outcomes
            by request_id. A line every window (on standard error, not with --json); at the end,
            after --grace for stragglers: offered and achieved throughput, latency percentiles,
            missing and duplicate outcomes, results by kind, dead letters, and for a ramp the knee:
            the highest offered rate before the first window whose requests' p99 passed the SLO's
            p99 (a second when not given) or were not all answered.
            Exit status: 0 when the SLO holds, 1 when it does not, 2 on a usage or connection error.
            """)

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        let kafka = try CommonOptions.clusterConfiguration(options)
        let generator = try GenerateCommand.generatorOptions(options)
        guard options.isSet("duration") else { throw UsageError("--duration is required") }
        let duration = try options.number("duration", range: 0.1...1e6)
        let schedule: RateSchedule
        switch (options.string("rate"), options.string("ramp")) {
        case (_?, nil): schedule = RateSchedule(try options.number("rate", range: 0.1...1e7))
        case (nil, let ramp?):
            let parts = ramp.split(separator: ":").map { Double($0) }
            guard parts.count == 2, let from = parts[0], let to = parts[1], from >= 0, to > 0, from <= 1e7, to <= 1e7
            else {
                throw UsageError("--ramp: '\(ramp)' is not R1:R2 with rates from 0 to 10000000 (R2 above 0)")
            }
            schedule = RateSchedule(from: from, to: to, over: duration)
        default: throw UsageError("give exactly one of --rate and --ramp")
        }
        var loadTest = LoadTest.Options(
            kafka: kafka, schedule: schedule, duration: .milliseconds(Int(duration * 1000)),
            runID: options.string("run-id") ?? String(UInt32.random(in: 0...UInt32.max), radix: 36))
        guard loadTest.runID.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" || $0 == "." }),
            !loadTest.runID.isEmpty, loadTest.runID.count <= 64
        else {
            throw UsageError("--run-id: '\(loadTest.runID)' must be 1 to 64 letters, digits, '_' or '.'")
        }
        loadTest.generator = generator
        loadTest.grace = .milliseconds(Int(try options.number("grace", range: 0...86_400) * 1000))
        loadTest.window = .milliseconds(Int(try options.number("window-s", range: 0.1...3600) * 1000))
        loadTest.slo = try slo(options.string("slo"))
        loadTest.requestsTopic = options.string("requests-topic")!
        loadTest.outcomesTopic = options.string("outcomes-topic")!
        loadTest.deadLetterTopic = options.string("dead-letter-topic")!
        if options.endsAtCheck() { return 0 }
        let json = options.flag("json")
        let report: LoadTestReport
        do {
            report = try await LoadTest.run(loadTest) { progress in
                if !json { FileHandle.standardError.write(Data((line(progress) + "\n").utf8)) }
            }
        } catch {
            FileHandle.standardError.write(Data("loadtest: \(error)\n".utf8))
            return 2
        }
        for (option, content) in [("html", { report.html() }), ("hdr", { report.hdrLog() })] {
            guard let path = options.string(option) else { continue }
            do {
                try Data(content().utf8).write(to: URL(fileURLWithPath: path))
            } catch {
                FileHandle.standardError.write(Data("loadtest: cannot write --\(option) \(path): \(error)\n".utf8))
                return 2
            }
        }
        print(json ? report.json() : report.table())
        return report.passed ? 0 : 1
    }

    /// `p99=MS,missing=N`, either part optional.
    static func slo(_ text: String?) throws(UsageError) -> LoadTest.SLO {
        var slo = LoadTest.SLO()
        guard let text else { return slo }
        for part in text.split(separator: ",") {
            let pieces = part.split(separator: "=", maxSplits: 1).map(String.init)
            switch (pieces.first, pieces.count == 2 ? Double(pieces[1]) : nil) {
            case ("p99", let value?) where value > 0: slo.p99Ms = value
            case ("missing", let value?) where value >= 0 && value == value.rounded(): slo.missing = Int(value)
            default: throw UsageError("--slo: '\(part)' is not p99=MS (above 0) or missing=N (a whole number)")
            }
        }
        return slo
    }

    /// A live line: the window just ended and the run so far.
    static func line(_ progress: LoadTest.Progress) -> String {
        let window = progress.window
        let latency = [50.0, 90, 99].map { Double(window.seen.value(atPercentile: $0)) / 1000 }
        let mix = window.results.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: " ")
        return String(
            format:
                "%6.1f s  offered %.0f/s  achieved %.0f/s  answered %d  outstanding %d  p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  %@  dead letters %d",
            progress.elapsed, window.sent > 0 ? window.offeredRate : 0, window.achievedRate, progress.answered,
            progress.outstanding,
            latency[0], latency[1], latency[2], mix.isEmpty ? "no outcomes" : mix, progress.deadLetters)
    }
}
