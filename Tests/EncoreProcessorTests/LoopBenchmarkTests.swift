import EncoreProcessor
import Testing

@Suite("bench --no-kafka: the dispatch loop alone")
struct LoopBenchmarkTests {
    @Test("every request reaches an outcome and is finished; the CPU is counted")
    func processesEverything() async {
        var options = LoopBenchmark.Options()
        options.count = 3000
        options.users = 100
        options.timeout = .seconds(120)
        let report = await LoopBenchmark.run(options)
        #expect(report.processed == 3000 && report.outcomes == 3000)
        #expect(report.cpuSeconds > 0 && report.elapsedSeconds > 0)
    }
}
