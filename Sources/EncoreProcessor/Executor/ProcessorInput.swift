import EncoreEvents
import Kafka

/// Everything that reaches a dispatch loop, in one stream so one task owns all state. Tests feed
/// the same inputs the consumer's forwarder does.
enum ProcessorInput: Sendable {
    /// Records already decoded (off the loop's thread).
    case records([IncomingRecord])
    /// Partitions assigned, with the offsets their previous owner finished beyond its commit, the
    /// ledger state and request journal of their users, read back from the changelog (by requests partition), and the
    /// commit each partition was assigned with (none when the group has none).
    case assigned(
        [KafkaTopicPartition], finished: [InputPartition: Set<Int64>],
        restored: [Int32: RestoredPartition], committed: [InputPartition: KafkaTopicPartitionOffset])
    /// Partitions being taken away; the hand-over gives them up with the offsets to commit.
    case revoked([KafkaTopicPartition], PartitionHandOver)
    /// The consumer failed for good.
    case consumerFailed(KafkaError)
    case consumerEnded
    /// A periodic commit ended: what the broker accepted (nothing when it refused).
    case commitFinished(landed: [InputPartition: KafkaTopicPartitionOffset], failed: Bool = false)
    /// The broker refused the commit of a hand-over: the next owner redoes `records` finished records.
    case handOverCommitRefused(records: Int)
    /// Exactly-once: the transaction holding everything produced so far and `landed`'s offsets
    /// committed (`error` nil) or failed.
    case transactionFinished(landed: [InputPartition: KafkaTopicPartitionOffset], error: KafkaError?)
    case attemptFinished(call: Int, attempt: Int, Result<PurchaseResult, any Error>, duration: Duration = .zero)
    /// The broker's answers for outputs, by the token they were produced with.
    case delivered([KafkaDelivery])
    case tick
    case shutdown
    /// The processor cannot go on (the ledger's state could not be restored).
    case failed(ProcessorError)
}

/// Gives revoked partitions up, committing `offsets`; `committed` learns whether the broker took
/// the commit (`nil`) or refused it.
typealias PartitionHandOver =
    @Sendable (
        _ offsets: [KafkaTopicPartitionOffset], _ committed: @escaping @Sendable (KafkaError?) -> Void
    ) -> Void

/// A partition the processor reads: of the requests topic, or of the optional sources topic.
struct InputPartition: Hashable, Comparable, Sendable, CustomStringConvertible {
    enum Topic: UInt8, Sendable { case requests, sources }
    var topic: Topic
    var number: Int32

    static func requests(_ number: Int32) -> InputPartition { InputPartition(topic: .requests, number: number) }

    /// The input partition of a topic's partition; `nil` for a topic the processor does not read.
    static func of(_ topic: String, _ number: Int32, in configuration: borrowing ProcessorConfiguration)
        -> InputPartition?
    {
        if topic == configuration.requestsTopic { return .requests(number) }
        if topic == configuration.sourcesTopic { return InputPartition(topic: .sources, number: number) }
        return nil
    }

    static func < (lhs: InputPartition, rhs: InputPartition) -> Bool {
        (lhs.topic.rawValue, lhs.number) < (rhs.topic.rawValue, rhs.number)
    }

    var description: String { "\(topic == .requests ? "" : "sources:")\(number)" }

    /// Hashed without `Hasher`, as ``RecordRef`` is: the worker looks a record's partition up
    /// several times (ownership, offsets), and its two fields come from the broker's assignment.
    func _rawHashValue(seed: Int) -> Int {
        let words = UInt64(UInt32(bitPattern: number)) | UInt64(topic.rawValue) << 32
        return mixedHash(words ^ UInt64(bitPattern: Int64(seed)))
    }
}

/// A record of an input partition, within one assignment of the partition.
struct RecordRef: Hashable, Sendable {
    var partition: InputPartition
    var offset: Int64
    /// Bumped each time the partition is assigned anew, so late completions of a previous
    /// assignment are not mistaken for current ones.
    var generation: Int

    /// Hashed without `Hasher` (a share of each request's cost, several lookups per output): its
    /// partition, offset and generation come from the broker, not from a client, so a fixed mix
    /// spreads them well enough.
    func _rawHashValue(seed: Int) -> Int {
        let words =
            UInt64(bitPattern: offset) &+ UInt64(UInt32(bitPattern: partition.number)) << 40
            &+ UInt64(partition.topic.rawValue) << 60 &+ UInt64(bitPattern: Int64(generation)) &* 0x9E37_79B9_7F4A_7C15
        return mixedHash(words ^ UInt64(bitPattern: Int64(seed)))
    }
}

/// splitmix64's finalizer: every bit of `value` moves about half of the result's bits. For keys
/// hashed without `Hasher` (`_rawHashValue(seed:)`, which `Dictionary` and `Set` call), with the
/// table's seed mixed in, so that two tables lay the same keys out differently.
@inline(__always)
func mixedHash(_ value: UInt64) -> Int {
    var z = value
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return Int(bitPattern: UInt(z ^ (z >> 31)))
}

/// A record of an input topic and what decoding it gave.
enum IncomingRecord: Sendable {
    // (An enum: the worker moves the message and the event out of it; a struct's fields were copied.)
    case request(KafkaMessage, Result<PurchaseRequestEvent, EventValidationError>)
    case source(KafkaMessage, Result<EntitlementSourceEvent, EventValidationError>)

    init(message: KafkaMessage, isSource: Bool = false) {
        self =
            isSource
            ? .source(message, Self.decode(message.value)) : .request(message, Self.decode(message.value))
    }

    static func decode<Event: EncoreEvent>(_ value: [UInt8]) -> Result<Event, EventValidationError> {
        do throws(EventValidationError) {
            return .success(try Event(jsonBytes: value))
        } catch {
            return .failure(error)
        }
    }
}
