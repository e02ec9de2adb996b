import Testing

@testable import Kafka

@Suite("Consumer statistics: what names a stall")
struct KafkaConsumerStatisticsTests {
    @Test("offsets, fetch states and the group's state are read from librdkafka's statistics JSON")
    func parses() {
        let json = """
            {"cgrp": {"state": "up", "join_state": "steady", "assignment_size": 2},
             "topics": {"requests": {"partitions": {
                "0": {"consumer_lag": 60, "hi_offset": 100, "ls_offset": 40, "next_offset": 40, "fetch_state": "active"},
                "1": {"consumer_lag": -1, "hi_offset": -1, "ls_offset": -1, "next_offset": -1, "fetch_state": "offset-query"},
                "2": {"consumer_lag": -1, "hi_offset": 9, "ls_offset": 9, "next_offset": -1, "fetch_state": "none"},
                "-1": {"consumer_lag": -1, "fetch_state": "none"}}}}}
            """
        let statistics = Array(json.utf8).withUnsafeBytes { KafkaConsumerStatistics.parse($0) }
        #expect(statistics.groupState == "up" && statistics.joinState == "steady" && statistics.assignmentSize == 2)
        let first = KafkaTopicPartition(topic: "requests", partition: 0)
        #expect(
            statistics.partitions[first]
                == .init(lag: 60, highWatermark: 100, lastStableOffset: 40, nextOffset: 40, fetchState: "active"))
        #expect(
            statistics.partitions[KafkaTopicPartition(topic: "requests", partition: 1)]?.fetchState == "offset-query")
        #expect(statistics.partitions.count == 2, "a partition not consumed (fetch_state none, no lag) is left out")
        #expect(statistics.lag == [first: 60])
        #expect(statistics.producerIDState == nil, "a consumer's statistics have no producer id")
        let producer = Array(#"{"ts": 5170001234, "eos": {"idemp_state": "Assigned", "idemp_stateage": 12}}"#.utf8)
            .withUnsafeBytes { KafkaConsumerStatistics.parse($0) }
        #expect(producer.producerIDState == "Assigned" && producer.writtenAtMicroseconds == 5_170_001_234)
        #expect(
            Array("not json".utf8).withUnsafeBytes { KafkaConsumerStatistics.parse($0) } == KafkaConsumerStatistics())
    }
}
