import Kafka

/// The broker deleted requests of a topic just filled before they were read (its retention, or the
/// embedded broker's limit). Their outcomes can never come, and a run waiting for them would wait
/// out its timeout.
public struct MissingRequests: Error, CustomStringConvertible {
    public var topic: String
    public var written: Int
    public var deleted: Int64
    public var partitions: Int
    /// The embedded broker's limit, not a retention setting, deleted them.
    public var embedded: Bool
    /// The option that runs against another broker, if the command has one.
    public var otherBroker: String?

    /// Throws when the broker deleted any of the `written` requests of `topic` (empty before).
    /// (Refused deliveries are not checked here: the generator's count of acknowledgements can
    /// trail the flush by a delivery report or two.)
    public static func check(
        _ topic: String, partitions: Int, written: Int, kafka: KafkaConfiguration, embedded: Bool,
        otherBroker: String?
    ) async throws {
        let deleted = try await KafkaAdmin(configuration: kafka).deletedRecords(of: topic, partitions: partitions)
        guard deleted > 0 else { return }
        throw MissingRequests(
            topic: topic, written: written, deleted: deleted, partitions: partitions, embedded: embedded,
            otherBroker: otherBroker)
    }

    public var description: String {
        let deletedThem =
            "the broker deleted \(deleted) of the \(written) requests written to \(topic) before they were read"
        if !embedded {
            return deletedThem + " (its retention), so their outcomes can never come; send fewer (--count) or raise "
                + "the broker's retention (retention.bytes, retention.ms)"
        }
        return deletedThem + " (the embedded broker keeps about 5 MB of records per partition and deletes the oldest "
            + "beyond it), so their outcomes can never come; spread them over more --partitions (\(partitions) now)"
            + (otherBroker.map { ", send fewer (--count), or use a broker that keeps them (\($0))" }
                ?? " or send fewer (--count)")
    }
}
