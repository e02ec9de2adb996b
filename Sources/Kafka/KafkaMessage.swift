/// A record header: a key and an optional binary value.
public struct KafkaHeader: Sendable, Hashable {
    public var key: String
    public var value: [UInt8]?

    public init(key: String, value: [UInt8]?) {
        self.key = key
        self.value = value
    }

    public init(key: String, string: String) {
        self.init(key: key, value: Array(string.utf8))
    }

    /// The value decoded as UTF-8, when it is valid UTF-8.
    public var stringValue: String? {
        value.flatMap { String(validating: $0, as: UTF8.self) }
    }
}

/// A record read from Kafka, with its coordinates.
public struct KafkaMessage: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    public var value: [UInt8]
    /// The headers as read, in one buffer: two allocations a record, not an array and one per
    /// header value (a consumer's records carry CloudEvents' six or more).
    public var headerBuffer: KafkaHeaderBuffer {
        get { storedHeaders ?? KafkaHeaderBuffer() }
        set { storedHeaders = newValue.isEmpty ? nil : newValue }
    }
    /// `nil` without headers: a copy of the message then retains no header buffers.
    private var storedHeaders: KafkaHeaderBuffer?
    /// Milliseconds since the epoch, when the broker reported a timestamp.
    public var timestampMs: Int64?

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8], headers: [KafkaHeader] = [],
        timestampMs: Int64? = nil
    ) {
        self.init(
            topic: topic, partition: partition, offset: offset, key: key, value: value,
            headerBuffer: KafkaHeaderBuffer(headers), timestampMs: timestampMs)
    }

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8], headerBuffer: KafkaHeaderBuffer,
        timestampMs: Int64? = nil
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.storedHeaders = headerBuffer.isEmpty ? nil : headerBuffer
        self.timestampMs = timestampMs
    }

    /// Whether the record has headers.
    public var hasHeaders: Bool { storedHeaders != nil }

    /// The headers, in order (built from ``headerBuffer`` at each read).
    public var headers: [KafkaHeader] {
        get { storedHeaders?.values ?? [] }
        set { headerBuffer = KafkaHeaderBuffer(newValue) }
    }

    /// The first header whose key is byte for byte `key`, decoded as UTF-8.
    public func header(_ key: String) -> String? { storedHeaders?.firstValue(key) }
}

/// A record to produce. `partition == nil` lets the partitioner choose by key.
public struct KafkaProducerRecord: Sendable {
    public var topic: String
    public var partition: Int32?
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [KafkaHeader]

    public init(topic: String, partition: Int32? = nil, key: [UInt8]?, value: [UInt8], headers: [KafkaHeader] = []) {
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value
        self.headers = headers
    }
}

/// Where the broker stored a produced record.
public struct KafkaDeliveryReport: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }
}

/// The broker's answer for a record produced with a token (``KafkaProducer/produce(_:token:)``).
public struct KafkaDelivery: Sendable {
    /// The token the record was produced with.
    public var token: UInt
    /// Why delivery failed; `nil` when the broker acknowledged the record.
    public var error: KafkaError?
    /// The record as it was produced: when delivery failed (to produce it again), and when it was
    /// acknowledged and its topic is the one the producer keeps acknowledged records of
    /// (`keepingAcknowledged`), its partition set.
    public var record: KafkaProducerRecord?
    /// The record's offset when the broker acknowledged it; -1 otherwise.
    public var offset: Int64

    public init(token: UInt, error: KafkaError?, record: KafkaProducerRecord?, offset: Int64 = -1) {
        self.token = token
        self.error = error
        self.record = record
        self.offset = offset
    }
}

/// A topic and partition.
public struct KafkaTopicPartition: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public static func < (lhs: KafkaTopicPartition, rhs: KafkaTopicPartition) -> Bool {
        (lhs.topic, lhs.partition) < (rhs.topic, rhs.partition)
    }

    public var description: String { "\(topic)[\(partition)]" }
}

/// A topic, partition and offset: for commits, the offset of the next record to read.
public struct KafkaTopicPartitionOffset: Sendable, Hashable {
    public var topicPartition: KafkaTopicPartition
    public var offset: Int64
    /// Commit metadata: a string kept by the group coordinator with the offset.
    public var metadata: String?

    public init(topic: String, partition: Int32, offset: Int64, metadata: String? = nil) {
        self.topicPartition = KafkaTopicPartition(topic: topic, partition: partition)
        self.offset = offset
        self.metadata = metadata
    }

    public var topic: String { topicPartition.topic }
    public var partition: Int32 { topicPartition.partition }
}
