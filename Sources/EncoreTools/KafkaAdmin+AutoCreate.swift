import Kafka

extension KafkaAdmin {
    /// Creates `topics` (existing ones are left as they are); on a broker without CreateTopics
    /// (librdkafka's mock cluster, which creates a topic with 4 partitions when its metadata is
    /// first asked for), asks for their metadata instead. Callers check the partitions they got.
    public static func create(
        _ topics: [KafkaTopicSpecification], kafka: KafkaConfiguration, logger: Logger
    ) async throws {
        do {
            try await KafkaAdmin(configuration: kafka).createTopics(topics, timeout: .seconds(5))
        } catch {
            logger.warning("cannot create topics (\(error)); relying on the broker's auto-creation")
            let producer = try KafkaProducer(configuration: kafka)
            for topic in topics { _ = try? await producer.prepare(topic: topic.name, timeout: .seconds(5)) }
            await producer.close()
        }
    }
}
