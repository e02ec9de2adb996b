import Testing

@testable import EncoreProcessor
@testable import Kafka

/// librdkafka's prefetch queue (all partitions): small, but never so small that one fetch fills it.
@Suite("The consumer's prefetch queue default")
struct PrefetchDefaultTests {
    @Test("2 MiB, at least two fetches of a partition; 16 MiB before librdkafka 2.1")
    func prefetch() {
        #expect(ProcessorConfiguration.prefetchKilobytes(partitionFetch: nil, refillsQuickly: true) == 2048)
        #expect(ProcessorConfiguration.prefetchKilobytes(partitionFetch: "1048576", refillsQuickly: true) == 2048)
        #expect(ProcessorConfiguration.prefetchKilobytes(partitionFetch: "4194304", refillsQuickly: true) == 8192)
        #expect(ProcessorConfiguration.prefetchKilobytes(partitionFetch: "1048577", refillsQuickly: true) == 2050)
        #expect(ProcessorConfiguration.prefetchKilobytes(partitionFetch: nil, refillsQuickly: false) == 16384)
    }

    @Test("the consumer takes it unless -X set it, and follows -X max.partition.fetch.bytes or its alias")
    func consumerConfiguration() {
        var configuration = ProcessorConfiguration(kafka: KafkaConfiguration())
        let quick = LibrdkafkaVersion.isAtLeast(2, 1)
        #expect(
            configuration.clientConfigurations(workers: 1).consumer["queued.max.messages.kbytes"]
                == (quick ? "2048" : "16384"))
        configuration.kafka["fetch.message.max.bytes"] = "3145728"
        #expect(
            configuration.clientConfigurations(workers: 1).consumer["queued.max.messages.kbytes"]
                == (quick ? "6144" : "16384"))
        configuration.kafka["max.partition.fetch.bytes"] = "4194304"
        #expect(
            configuration.clientConfigurations(workers: 1).consumer["queued.max.messages.kbytes"]
                == (quick ? "8192" : "16384"))
        configuration.kafka["queued.max.messages.kbytes"] = "100"
        #expect(configuration.clientConfigurations(workers: 1).consumer["queued.max.messages.kbytes"] == "100")
    }
}
