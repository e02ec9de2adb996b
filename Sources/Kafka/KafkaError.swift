import CRdKafka

/// An error of the Kafka layer: librdkafka's code, its name and message, and how to treat it.
public struct KafkaError: Error, Sendable, CustomStringConvertible {
    /// What went wrong; librdkafka's own codes are carried as their raw value.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: Int32

        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// A configuration property is unknown or its value is invalid.
        public static let invalidConfiguration = Code(rawValue: -10_001)
        /// The client was closed before the operation completed.
        public static let closed = Code(rawValue: -10_002)
        /// An argument given to the Kafka layer is invalid.
        public static let invalidArgument = Code(rawValue: -10_003)
        /// The task waiting for the operation was cancelled before it completed.
        public static let cancelled = Code(rawValue: -10_004)
        /// librdkafka's local timeout (`RD_KAFKA_RESP_ERR__TIMED_OUT`).
        public static let timedOut = Code(rawValue: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue)
        /// A message was not delivered within `message.timeout.ms`.
        public static let messageTimedOut = Code(rawValue: RD_KAFKA_RESP_ERR__MSG_TIMED_OUT.rawValue)
        /// The local producer queue is full.
        public static let queueFull = Code(rawValue: RD_KAFKA_RESP_ERR__QUEUE_FULL.rawValue)
        public static let unknownTopicOrPartition = Code(rawValue: RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART.rawValue)
        public static let topicAlreadyExists = Code(rawValue: RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS.rawValue)
        public static let noOffset = Code(rawValue: RD_KAFKA_RESP_ERR__NO_OFFSET.rawValue)
        /// This producer was fenced: another one initialized transactions with its
        /// `transactional.id` (locally `_FENCED`; the broker's `PRODUCER_FENCED` or
        /// `INVALID_PRODUCER_EPOCH`).
        public static let fenced = Code(rawValue: RD_KAFKA_RESP_ERR__FENCED.rawValue)
        public static let producerFenced = Code(rawValue: RD_KAFKA_RESP_ERR_PRODUCER_FENCED.rawValue)
        public static let invalidProducerEpoch = Code(rawValue: RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH.rawValue)

        public var description: String {
            if rawValue <= -10_000 {
                switch self {
                case .invalidConfiguration: return "INVALID_CONFIGURATION"
                case .closed: return "CLOSED"
                case .cancelled: return "CANCELLED"
                default: return "INVALID_ARGUMENT"
                }
            }
            return String(cString: rd_kafka_err2name(rd_kafka_resp_err_t(rawValue: rawValue)))
        }
    }

    public var code: Code
    /// librdkafka's symbolic name of the code, e.g. `UNKNOWN_TOPIC_OR_PART`.
    public var name: String { code.description }
    /// A human-readable message naming what failed (topic, property, partition...).
    public var message: String
    /// The operation may succeed when tried again.
    public var isRetriable: Bool
    /// The client instance is unusable and must be recreated.
    public var isFatal: Bool

    public init(code: Code, message: String, isRetriable: Bool = false, isFatal: Bool = false) {
        self.code = code
        self.message = message
        self.isRetriable = isRetriable
        self.isFatal = isFatal
    }

    public var description: String { "\(name): \(message)" }

    /// Whether a transactional producer with the same `transactional.id` fenced this one.
    public var isFencing: Bool { [.fenced, .producerFenced, .invalidProducerEpoch].contains(code) }

    /// Wraps a librdkafka response code, with `context` naming what was being done.
    init(_ err: rd_kafka_resp_err_t, context: String, isFatal: Bool = false) {
        let text = String(cString: rd_kafka_err2str(err))
        self.init(
            code: Code(rawValue: err.rawValue), message: context.isEmpty ? text : "\(context): \(text)",
            isRetriable: KafkaError.isRetriable(err), isFatal: isFatal)
    }

    /// Wraps and destroys an `rd_kafka_error_t`.
    init(consuming error: OpaquePointer, context: String) {
        let code = rd_kafka_error_code(error)
        let text = String(cString: rd_kafka_error_string(error))
        self.init(
            code: Code(rawValue: code.rawValue), message: context.isEmpty ? text : "\(context): \(text)",
            isRetriable: rd_kafka_error_is_retriable(error) != 0, isFatal: rd_kafka_error_is_fatal(error) != 0)
        rd_kafka_error_destroy(error)
    }

    /// Whether a record whose delivery failed with this error may be produced again. librdkafka
    /// has already retried transient errors until `message.timeout.ms`; what is left is worth
    /// another try only when the cluster was out of reach. A missing topic, a refused
    /// authorization or a record too large fail the same way every time.
    public var isRetriableDelivery: Bool {
        guard !isFatal else { return false }
        switch rd_kafka_resp_err_t(rawValue: code.rawValue) {
        case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__TRANSPORT,
            RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
            return true
        default:
            return false
        }
    }

    static func isRetriable(_ err: rd_kafka_resp_err_t) -> Bool {
        switch err {
        case RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
            RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
            RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
            RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
            return true
        default:
            return false
        }
    }
}
