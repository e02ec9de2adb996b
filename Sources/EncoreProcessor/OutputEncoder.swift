import EncoreEvents
import Kafka

/// Turns outcomes and dead letters into records with their CloudEvents headers. Pure and
/// `Sendable`, so encoding runs beside the processor's loop rather than on it.
struct OutputEncoder: Sendable {
    let outcomesTopic: String
    let deadLetterTopic: String
    let entitlementsTopic: String
    let stateTopic: String
    /// The headers that never change, per event type (`ce_id` and `ce_time` are filled per record).
    private let templates: [EventType: [KafkaHeader]]

    init(configuration: ProcessorConfiguration) {
        outcomesTopic = configuration.outcomesTopic
        deadLetterTopic = configuration.deadLetterTopic
        entitlementsTopic = configuration.entitlementsTopic
        stateTopic = configuration.stateTopic
        var templates: [EventType: [KafkaHeader]] = [:]
        for type in EventType.allCases {
            templates[type] = CloudEventHeaders(id: "", source: configuration.source, type: type, timeMs: 0).headers.map
            {
                KafkaHeader(key: $0.key, string: $0.value)
            }
        }
        self.templates = templates
    }

    func record(for output: UnsentOutput) -> KafkaProducerRecord {
        switch output {
        case .outcome(let outcome): record(for: outcome)
        case .change(let change): record(for: change)
        case .state(let state, let partition): record(forState: state, partition: partition)
        case .deadLetter(let letter, let key): record(for: letter, key: key)
        case .record(let record): record
        }
    }

    func record(for outcome: PurchaseOutcomeEvent) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: outcomesTopic, key: Array(outcome.key.utf8), value: outcome.jsonBytes(),
            headers: headers(id: "outcome:\(outcome.requestID)", type: .purchaseOutcome, timeMs: outcome.completedAtMs))
    }

    func record(for letter: DeadLetterEvent, key: [UInt8]?) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: deadLetterTopic, key: key, value: letter.jsonBytes(),
            headers: headers(
                id: "deadletter:\(letter.originalTopic)/\(letter.originalPartition)/\(letter.originalOffset)",
                type: .deadLetter, timeMs: letter.failedAtMs))
    }

    /// `ce_id` is `entitlement:{user key}:{sequence}`: a change published twice (after a crash
    /// between its delivery and its changelog record) carries the same id.
    func record(for change: EntitlementChangeEvent) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: entitlementsTopic, key: Array(change.key.utf8), value: change.jsonBytes(),
            headers: headers(
                id: "entitlement:\(change.key):\(change.sequence)", type: .entitlementChanged,
                timeMs: change.effectiveAtMs))
    }

    /// The user's whole state, to the partition of the user's requests (co-partitioned).
    func record(forState state: EntitlementStateRecord, partition: Int32) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: stateTopic, partition: partition, key: Array(state.key.utf8), value: state.jsonBytes(),
            headers: headers(
                id: "state:\(state.key):\(state.sequence):\(state.updatedAtMs)", type: .entitlementState,
                timeMs: state.updatedAtMs))
    }

    private func headers(id: String, type: EventType, timeMs: Int64) -> [KafkaHeader] {
        (templates[type] ?? []).map { header in
            switch header.key {
            case "ce_id": KafkaHeader(key: header.key, string: id)
            case "ce_time": KafkaHeader(key: header.key, string: CloudEventHeaders.rfc3339(ms: timeMs))
            default: header
            }
        }
    }
}
