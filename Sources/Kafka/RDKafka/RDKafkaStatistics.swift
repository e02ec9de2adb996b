import Foundation

/// Reads librdkafka's statistics JSON (the `stats_cb` payload).
enum RDKafkaStatistics {
    /// `topics.*.partitions.*.consumer_lag` of the partitions this client consumes (librdkafka
    /// reports -1 where it does not know the lag yet: left out).
    static func consumerLag(_ json: UnsafeRawBufferPointer) -> [KafkaTopicPartition: Int64] {
        guard let root = try? JSONSerialization.jsonObject(with: Data(json)) as? [String: Any],
            let topics = root["topics"] as? [String: Any]
        else { return [:] }
        var lag: [KafkaTopicPartition: Int64] = [:]
        for (topic, value) in topics {
            guard let partitions = (value as? [String: Any])?["partitions"] as? [String: Any] else { continue }
            for (key, value) in partitions {
                guard let partition = Int32(key), partition >= 0, let fields = value as? [String: Any],
                    let consumerLag = (fields["consumer_lag"] as? NSNumber)?.int64Value, consumerLag >= 0
                else { continue }
                lag[KafkaTopicPartition(topic: topic, partition: partition)] = consumerLag
            }
        }
        return lag
    }
}
