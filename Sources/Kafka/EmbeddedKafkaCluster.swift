import CRdKafka

/// librdkafka's in-process mock cluster: real Kafka protocol on loopback, for demos and tests.
///
/// Supports produce/fetch, consumer groups and transactions, plus fault injection. It keeps only
/// about 5 MiB per partition and silently drops older records.
public final class EmbeddedKafkaCluster: Sendable {
    private let client: RDKafkaClient
    private let cluster: MockClusterPointer

    /// The `bootstrap.servers` string of the cluster's brokers.
    public let bootstrapServers: String

    /// Starts a cluster of `brokers` brokers (ids 1...brokers).
    public init(brokers: Int = 1, logger: Logger = Logger(label: "kafka.embedded")) throws(KafkaError) {
        var configuration = KafkaConfiguration()
        configuration["client.id"] = "encore-embedded-broker"
        client = try RDKafkaClient.make(
            .producer, configuration: configuration, callbacks: RDKafkaCallbacks(logger: logger))
        guard let cluster = rd_kafka_mock_cluster_new(client.handle, Int32(brokers)) else {
            throw KafkaError(code: .invalidArgument, message: "cannot start an embedded cluster of \(brokers) brokers")
        }
        self.cluster = MockClusterPointer(pointer: cluster)
        bootstrapServers = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster.pointer)
    }

    /// Creates `name` with `partitions` partitions.
    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1) throws(KafkaError) {
        let err = rd_kafka_mock_topic_create(cluster.pointer, name, Int32(partitions), Int32(replicationFactor))
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "create topic '\(name)'") }
    }

    /// Makes the next requests of `apiKey` (e.g. 0 = Produce) fail with `errors`, one per request.
    public func pushRequestErrors(apiKey: Int16, _ errors: [KafkaError.Code]) {
        let native = errors.map { rd_kafka_resp_err_t(rawValue: $0.rawValue) }
        native.withUnsafeBufferPointer { buffer in
            rd_kafka_mock_push_request_errors_array(cluster.pointer, apiKey, buffer.count, buffer.baseAddress)
        }
    }

    /// Forgets the errors pushed for requests of `apiKey` and not used yet.
    public func clearRequestErrors(apiKey: Int16) {
        rd_kafka_mock_clear_request_errors(cluster.pointer, apiKey)
    }

    /// Makes metadata requests for `topic` answer `code` (e.g. ``KafkaError/Code/unknownTopicOrPartition``
    /// to stand for a topic that does not exist: the mock cluster otherwise creates topics on first use).
    public func setTopicError(_ topic: String, _ code: KafkaError.Code) {
        rd_kafka_mock_topic_set_error(cluster.pointer, topic, rd_kafka_resp_err_t(rawValue: code.rawValue))
    }

    /// Adds `rtt` of latency to every request broker `id` answers: how tests stand for an outage.
    /// (Taking a mock broker down or up rebinds its old port at once, and librdkafka aborts the
    /// process when another socket took it: likely on a busy machine. Those calls are not offered.)
    public func setRoundTripTime(broker id: Int32, _ rtt: Duration) throws(KafkaError) {
        let err = rd_kafka_mock_broker_set_rtt(cluster.pointer, id, Int32(rtt.milliseconds))
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "broker \(id) rtt") }
    }
}

/// `@unchecked Sendable`: the mock cluster is created once, used only through librdkafka's mock API
/// (which serializes on the cluster's own thread) and destroyed in the owner's `deinit`.
struct MockClusterPointer: @unchecked Sendable {
    let pointer: OpaquePointer
}
