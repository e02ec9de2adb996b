import CRdKafka

/// A topic to create.
public struct KafkaTopicSpecification: Sendable, Hashable {
    public var name: String
    public var partitions: Int
    public var replicationFactor: Int
    /// Topic configs such as `cleanup.policy=compact`.
    public var configs: [String: String]

    public init(name: String, partitions: Int, replicationFactor: Int = 1, configs: [String: String] = [:]) {
        self.name = name
        self.partitions = partitions
        self.replicationFactor = replicationFactor
        self.configs = configs
    }
}

/// Cluster administration: topics and metadata.
public final class KafkaAdmin: Sendable {
    let client: RDKafkaClient

    public init(configuration: KafkaConfiguration, logger: Logger = Logger(label: "kafka.admin")) throws(KafkaError) {
        var configuration = configuration
        // Watermarks are the end of everything written, never the last stable offset: a
        // read_committed reader reads to it once the transactions open there end. (librdkafka's
        // default is read_committed, and Tansu answers such a query with 0 while any transaction is
        // open on the partition: an exactly-once restore then read nothing.)
        configuration["isolation.level"] = "read_uncommitted"
        client = try RDKafkaClient.make(
            .producer, configuration: configuration, callbacks: RDKafkaCallbacks(logger: logger))
    }

    /// Creates `topics`; ones that already exist are left as they are when `ignoreExisting`.
    public func createTopics(
        _ topics: [KafkaTopicSpecification], ignoreExisting: Bool = true, timeout: Duration = .seconds(30)
    ) async throws(KafkaError) {
        let client = self.client
        try await RDKafkaBlocking.run { () throws(KafkaError) in
            var errorText = [CChar](repeating: 0, count: 512)
            var natives: [OpaquePointer?] = []
            defer { for native in natives { rd_kafka_NewTopic_destroy(native) } }
            for topic in topics {
                guard
                    let native = rd_kafka_NewTopic_new(
                        topic.name, Int32(topic.partitions), Int32(topic.replicationFactor), &errorText,
                        errorText.count)
                else {
                    throw KafkaError(
                        code: .invalidArgument, message: "topic '\(topic.name)': \(String(cBuffer: errorText))")
                }
                natives.append(native)
                for (key, value) in topic.configs.sorted(by: { $0.key < $1.key }) {
                    let err = rd_kafka_NewTopic_set_config(native, key, value)
                    guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                        throw KafkaError(err, context: "topic '\(topic.name)' config \(key)=\(value)")
                    }
                }
            }
            let queue = rd_kafka_queue_new(client.handle)
            defer { rd_kafka_queue_destroy(queue) }
            let options = rd_kafka_AdminOptions_new(client.handle, RD_KAFKA_ADMIN_OP_CREATETOPICS)
            defer { rd_kafka_AdminOptions_destroy(options) }
            _ = rd_kafka_AdminOptions_set_operation_timeout(
                options, Int32(timeout.milliseconds), &errorText, errorText.count)
            _ = rd_kafka_AdminOptions_set_request_timeout(
                options, Int32(timeout.milliseconds), &errorText, errorText.count)
            natives.withUnsafeMutableBufferPointer { buffer in
                rd_kafka_CreateTopics(client.handle, buffer.baseAddress, buffer.count, options, queue)
            }
            guard let event = rd_kafka_queue_poll(queue, Int32(timeout.milliseconds) + 5000) else {
                throw KafkaError(code: .timedOut, message: "create topics: no answer within \(timeout)")
            }
            defer { rd_kafka_event_destroy(event) }
            let err = rd_kafka_event_error(event)
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(err, context: "create topics: \(String(cString: rd_kafka_event_error_string(event)))")
            }
            let result = rd_kafka_event_CreateTopics_result(event)
            var count = 0
            guard let results = rd_kafka_CreateTopics_result_topics(result, &count) else { return }
            for index in 0..<count {
                let topicResult = results[index]
                let err = rd_kafka_topic_result_error(topicResult)
                if err == RD_KAFKA_RESP_ERR_NO_ERROR
                    || (ignoreExisting && err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
                {
                    continue
                }
                let name = String(cString: rd_kafka_topic_result_name(topicResult))
                let text = rd_kafka_topic_result_error_string(topicResult).map { String(cString: $0) } ?? ""
                throw KafkaError(err, context: "create topic '\(name)' \(text)")
            }
        }
    }

    /// The number of partitions of `topic`, or `nil` when the cluster does not know it.
    public func partitionCount(of topic: String, timeout: Duration = .seconds(10)) async throws(KafkaError) -> Int? {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> Int? in
            let rkt = rd_kafka_topic_new(client.handle, topic, nil)
            defer { rd_kafka_topic_destroy(rkt) }
            var metadata: UnsafePointer<rd_kafka_metadata>? = nil
            let err = rd_kafka_metadata(client.handle, 0, rkt, &metadata, Int32(timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
                throw KafkaError(err, context: "metadata of topic '\(topic)'")
            }
            defer { rd_kafka_metadata_destroy(metadata) }
            guard metadata.pointee.topic_cnt > 0 else { return nil }
            let entry = metadata.pointee.topics[0]
            if entry.err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART { return nil }
            guard entry.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(entry.err, context: "metadata of topic '\(topic)'")
            }
            return Int(entry.partition_cnt)
        }
    }

    /// Records deleted from `topic`, which started empty, by the broker's retention (or the
    /// embedded broker's limit of about 5 MB a partition): the sum of its partitions' first
    /// offsets. (Not the end less the start: Tansu's end can trail the acknowledgements for a
    /// moment.)
    public func deletedRecords(of topic: String, partitions: Int) async throws(KafkaError) -> Int64 {
        var deleted: Int64 = 0
        for partition in 0..<Int32(partitions) {
            deleted += try await watermarks(of: KafkaTopicPartition(topic: topic, partition: partition)).low
        }
        return deleted
    }

    /// Low and high watermarks (first offset, next offset to be written) of one partition.
    public func watermarks(
        of partition: KafkaTopicPartition, timeout: Duration = .seconds(10)
    ) async throws(KafkaError) -> (low: Int64, high: Int64) {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> (low: Int64, high: Int64) in
            var low: Int64 = 0
            var high: Int64 = 0
            let err = rd_kafka_query_watermark_offsets(
                client.handle, partition.topic, partition.partition, &low, &high, Int32(timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(err, context: "watermarks of \(partition)")
            }
            return (low, high)
        }
    }
}
