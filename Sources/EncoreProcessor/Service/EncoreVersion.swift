import Kafka

/// This build's version, and the librdkafka it runs with.
public enum EncoreVersion {
    /// The release this source tree is.
    public static let current = "0.12.0"

    /// `encore-processor 0.12.0 (librdkafka 2.0.2)`.
    public static var description: String { "encore-processor \(current) (librdkafka \(LibrdkafkaVersion.string))" }
}
