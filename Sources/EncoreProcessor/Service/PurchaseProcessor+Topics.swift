import EncoreEvents
import Kafka

extension PurchaseProcessor {
    /// The ledger's changelog must be co-partitioned with the requests (and the sources topic
    /// too): checked at start; a missing changelog is created, compacted, with the same partitions.
    func checkTopics() async throws(ProcessorError) {
        var adminConfiguration = configuration.kafka
        // Asking for a missing topic's metadata must not create it with the broker's defaults.
        adminConfiguration["allow.auto.create.topics"] = "false"
        do {
            let admin = try KafkaAdmin(configuration: adminConfiguration, logger: Logger(label: "encore.admin"))
            guard let requests = try await admin.partitionCount(of: configuration.requestsTopic) else {
                throw ProcessorError(
                    .invalidConfiguration,
                    "requests-topic: '\(configuration.requestsTopic)' does not exist (create the topics with `encore-processor topics create`)"
                )
            }
            var state = try await admin.partitionCount(of: configuration.stateTopic)
            if state == nil {
                logger.info(
                    "creating the changelog (ledger and request journal) '\(configuration.stateTopic)' with \(requests) partitions"
                )
                try await admin.createTopics([
                    KafkaTopicSpecification(
                        name: configuration.stateTopic, partitions: requests, replicationFactor: -1,
                        configs: ["cleanup.policy": "compact"])
                ])
                state = try await admin.partitionCount(of: configuration.stateTopic)
            }
            for (option, topic, count) in [
                ("state-topic", configuration.stateTopic, state),
                ("sources-topic", configuration.sourcesTopic, nil),
            ] {
                guard let topic else { continue }
                let partitions = option == "state-topic" ? count : try await admin.partitionCount(of: topic)
                guard let partitions else {
                    throw ProcessorError(.invalidConfiguration, "\(option): '\(topic)' does not exist")
                }
                guard partitions == requests else {
                    throw ProcessorError(
                        .invalidConfiguration,
                        "\(option): '\(topic)' has \(partitions) partitions but '\(configuration.requestsTopic)' has \(requests); they must be co-partitioned (same key, same partition count) so one member owns all of a user's records"
                    )
                }
            }
        } catch let error as ProcessorError {
            throw error
        } catch {
            throw ProcessorError(.kafka, "cannot check the topics: \(error)")
        }
    }
}
