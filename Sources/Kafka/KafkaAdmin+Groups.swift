import CRdKafka

/// A consumer group as its coordinator describes it.
public struct KafkaGroupDescription: Sendable, Hashable {
    public var group: String
    /// `Empty`, `Stable`, `PreparingRebalance`, `CompletingRebalance` or `Dead`.
    public var state: String
    /// Members in the group now.
    public var members: Int

    /// Whether a member holds (or may hold) partitions: the group is not `Empty` or `Dead` (an
    /// unknown state counts as active).
    public var isActive: Bool { members > 0 || !(state == "Empty" || state == "Dead") }
}

extension KafkaAdmin {
    /// Describes `group` (state and members); a group the cluster does not know is `Dead` with no
    /// member; `nil` when the broker cannot describe groups (librdkafka's mock cluster).
    public func describeGroup(_ group: String, timeout: Duration = .seconds(10)) async throws(KafkaError)
        -> KafkaGroupDescription?
    {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> KafkaGroupDescription? in
            var list: UnsafePointer<rd_kafka_group_list>? = nil
            let err = rd_kafka_list_groups(client.handle, group, &list, Int32(timeout.milliseconds))
            if err == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE { return nil }
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let list else {
                throw KafkaError(err, context: "describe group '\(group)'")
            }
            defer { rd_kafka_group_list_destroy(list) }
            for index in 0..<Int(list.pointee.group_cnt) {
                let info = list.pointee.groups[index]
                guard String(cString: info.group) == group else { continue }
                if info.err != RD_KAFKA_RESP_ERR_NO_ERROR && info.err != RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND {
                    throw KafkaError(info.err, context: "describe group '\(group)'")
                }
                return KafkaGroupDescription(
                    group: group, state: info.state.map { String(cString: $0) } ?? "",
                    members: Int(info.member_cnt))
            }
            return KafkaGroupDescription(group: group, state: "Dead", members: 0)
        }
    }

    /// For each partition, the first offset whose record timestamp is at or after `timestampMs`
    /// (`-1` when every record is older: the end).
    public func offsets(
        atOrAfter timestampMs: Int64, of partitions: [KafkaTopicPartition], timeout: Duration = .seconds(10)
    ) async throws(KafkaError) -> [KafkaTopicPartitionOffset] {
        let client = self.client
        return try await RDKafkaBlocking.run { () throws(KafkaError) -> [KafkaTopicPartitionOffset] in
            let list = RDKafkaTopicPartitionList.make(
                partitions.map {
                    KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: timestampMs)
                })
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let err = rd_kafka_offsets_for_times(client.handle, list, Int32(timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(err, context: "offsets for times") }
            if let error = RDKafkaTopicPartitionList.firstError(list, context: "offsets for times") { throw error }
            return RDKafkaTopicPartitionList.entries(list)
        }
    }
}
