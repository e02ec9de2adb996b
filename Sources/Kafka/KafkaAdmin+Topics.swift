import CRdKafka

/// A topic as the cluster describes it.
public struct KafkaTopicDescription: Sendable, Hashable {
    public var name: String
    public var partitions: Int
    /// The fewest replicas any partition has.
    public var replicationFactor: Int
}

extension KafkaAdmin {
    /// Every topic of the cluster (internal ones, `__`-prefixed, left out), sorted by name.
    public func listTopics(timeout: Duration = .seconds(10)) async throws(KafkaError) -> [KafkaTopicDescription] {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> [KafkaTopicDescription] in
            var metadata: UnsafePointer<rd_kafka_metadata>? = nil
            let err = rd_kafka_metadata(client.handle, 1, nil, &metadata, Int32(timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
                throw KafkaError(err, context: "metadata of the cluster")
            }
            defer { rd_kafka_metadata_destroy(metadata) }
            var topics: [KafkaTopicDescription] = []
            for index in 0..<Int(metadata.pointee.topic_cnt) {
                let topic = metadata.pointee.topics[index]
                let name = String(cString: topic.topic)
                guard topic.err == RD_KAFKA_RESP_ERR_NO_ERROR, !name.hasPrefix("__") else { continue }
                let replicas = (0..<Int(topic.partition_cnt)).map { Int(topic.partitions[$0].replica_cnt) }
                topics.append(
                    KafkaTopicDescription(
                        name: name, partitions: Int(topic.partition_cnt), replicationFactor: replicas.min() ?? 0))
            }
            return topics.sorted { $0.name < $1.name }
        }
    }

    /// `topic`'s configuration (`cleanup.policy`, `retention.ms`...); `nil` when the broker cannot
    /// describe configurations (librdkafka's mock cluster).
    public func topicConfiguration(_ topic: String, timeout: Duration = .seconds(10)) async throws(KafkaError)
        -> [String: String]?
    {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> [String: String]? in
            var resource: OpaquePointer? = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic)
            defer { rd_kafka_ConfigResource_destroy(resource) }
            let queue = rd_kafka_queue_new(client.handle)
            defer { rd_kafka_queue_destroy(queue) }
            let options = rd_kafka_AdminOptions_new(client.handle, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS)
            defer { rd_kafka_AdminOptions_destroy(options) }
            var errorText = [CChar](repeating: 0, count: 512)
            _ = rd_kafka_AdminOptions_set_request_timeout(
                options, Int32(timeout.milliseconds), &errorText, errorText.count)
            rd_kafka_DescribeConfigs(client.handle, &resource, 1, options, queue)
            guard let event = rd_kafka_queue_poll(queue, Int32(timeout.milliseconds) + 5000) else {
                throw KafkaError(
                    code: .timedOut, message: "describe configs of '\(topic)': no answer within \(timeout)")
            }
            defer { rd_kafka_event_destroy(event) }
            let err = rd_kafka_event_error(event)
            if err == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE || err == RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION
                || err == RD_KAFKA_RESP_ERR__TIMED_OUT
            {
                return nil
            }
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(err, context: "describe configs of '\(topic)'")
            }
            var count = 0
            guard let results = rd_kafka_DescribeConfigs_result_resources(event, &count), count > 0,
                let described = results[0]
            else { return nil }
            let resourceError = rd_kafka_ConfigResource_error(described)
            guard resourceError == RD_KAFKA_RESP_ERR_NO_ERROR else {
                if resourceError == RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION { return nil }
                throw KafkaError(resourceError, context: "describe configs of '\(topic)'")
            }
            var entryCount = 0
            guard let entries = rd_kafka_ConfigResource_configs(described, &entryCount) else { return [:] }
            var configuration: [String: String] = [:]
            for index in 0..<entryCount {
                guard let entry = entries[index], let name = rd_kafka_ConfigEntry_name(entry) else { continue }
                configuration[String(cString: name)] = rd_kafka_ConfigEntry_value(entry).map { String(cString: $0) }
            }
            return configuration
        }
    }
}
