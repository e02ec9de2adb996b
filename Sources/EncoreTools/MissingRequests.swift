import Kafka

/// A requests topic just filled does not hold every request written to it: the broker refused some
/// or deleted some before they were read. Their outcomes can never come, and a run waiting for
/// them would wait out its timeout.
public struct MissingRequests: Error, CustomStringConvertible {
    public var topic: String
    public var written: Int
    /// Requests the broker acknowledged, and how many of those the topic holds now.
    public var acknowledged: Int
    public var failed: Int
    public var held: Int64
    public var partitions: Int
    /// The embedded broker's limit, not a retention setting, deleted them.
    public var embedded: Bool
    /// The option that runs against another broker, if the command has one.
    public var otherBroker: String?

    /// Throws unless `topic`, empty before `written` filled it, holds every request written.
    public static func check(
        _ topic: String, partitions: Int, written: LoadGenerator.Progress, kafka: KafkaConfiguration, embedded: Bool,
        otherBroker: String?
    ) async throws {
        let held = try await KafkaAdmin(configuration: kafka).heldRecords(of: topic, partitions: partitions)
        guard written.acknowledged < written.sent || held < written.acknowledged else { return }
        throw MissingRequests(
            topic: topic, written: written.sent, acknowledged: written.acknowledged, failed: written.errors, held: held,
            partitions: partitions, embedded: embedded, otherBroker: otherBroker)
    }

    public var description: String {
        if acknowledged < written {
            return "the broker acknowledged \(acknowledged) of the \(written) requests written to \(topic) "
                + "(\(failed) deliveries failed), so their outcomes can never come"
        }
        let missing =
            "the broker holds \(held) of the \(written) requests written to \(topic), \(Int64(written) - held) "
        if !embedded {
            return missing + "were deleted by the topic's retention before they were read, so their outcomes can never "
                + "come; send fewer (--count) or raise the broker's retention (retention.bytes, retention.ms)"
        }
        return missing + "were deleted before they were read (the embedded broker keeps about 5 MB of records per "
            + "partition and deletes the oldest beyond it), so their outcomes can never come; spread them over more "
            + "--partitions (\(partitions) now)"
            + (otherBroker.map { ", send fewer (--count), or use a broker that keeps them (\($0))" }
                ?? " or send fewer (--count)")
    }
}
