import CRdKafka

/// librdkafka properties as strings, with typed conveniences for the common ones.
///
/// Any property librdkafka knows can be set (security, SASL, TLS...); an unknown property or an
/// invalid value is reported as a ``KafkaError`` naming it when a client is created or when
/// ``validate()`` is called.
public struct KafkaConfiguration: Sendable, Equatable {
    public private(set) var properties: [(key: String, value: String)]

    public init(_ properties: [String: String] = [:]) {
        self.properties = properties.sorted { $0.key < $1.key }.map { (key: $0.key, value: $0.value) }
    }

    public static func == (lhs: KafkaConfiguration, rhs: KafkaConfiguration) -> Bool {
        lhs.properties.elementsEqual(rhs.properties) { $0.key == $1.key && $0.value == $1.value }
    }

    /// The value of a property, or `nil` when it was not set here.
    public subscript(key: String) -> String? {
        get { properties.last { $0.key == key }?.value }
        set {
            properties.removeAll { $0.key == key }
            if let newValue { properties.append((key: key, value: newValue)) }
        }
    }

    /// Sets `key` only when it has no value yet: defaults that a user's `-X` settings override.
    public mutating func setDefault(_ key: String, _ value: String) {
        if self[key] == nil { self[key] = value }
    }

    /// The properties as they may be printed: secrets masked, URL credentials removed.
    public var redactedProperties: [(key: String, value: String)] {
        properties.map { (key: $0.key, value: Redaction.display($0.value, forKey: $0.key)) }
    }

    /// Merges `other` over `self`; properties in `other` win.
    public func merging(_ other: KafkaConfiguration) -> KafkaConfiguration {
        var merged = self
        for (key, value) in other.properties { merged[key] = value }
        return merged
    }

    /// `bootstrap.servers`: comma-separated `host:port` list.
    public var bootstrapServers: String? {
        get { self["bootstrap.servers"] }
        set { self["bootstrap.servers"] = newValue }
    }

    /// `client.id`.
    public var clientID: String? {
        get { self["client.id"] }
        set { self["client.id"] = newValue }
    }

    /// `group.id` of a consumer.
    public var groupID: String? {
        get { self["group.id"] }
        set { self["group.id"] = newValue }
    }

    /// Parses one `key=value` assignment as given to `-X` on the command line.
    public static func parseAssignment(_ text: String) throws(KafkaError) -> (key: String, value: String) {
        guard let equals = text.firstIndex(of: "="), equals != text.startIndex else {
            // (Not echoed: it may be a secret given without its key.)
            throw KafkaError(
                code: .invalidConfiguration, message: "expected key=value for a librdkafka property (got no '=')")
        }
        return (String(text[..<equals]), String(text[text.index(after: equals)...]))
    }

    /// Whether librdkafka knows a property named `key` (a mistyped key's value is never shown:
    /// it may be a secret whose key lost the letters that mark it as one).
    public static func isKnownProperty(_ key: String) -> Bool {
        guard let conf = rd_kafka_conf_new() else { return false }
        defer { rd_kafka_conf_destroy(conf) }
        var size = 0
        return rd_kafka_conf_get(conf, key, nil, &size) != RD_KAFKA_CONF_UNKNOWN
    }

    /// Checks every property against librdkafka without creating a client.
    public func validate() throws(KafkaError) {
        let conf = try makeNativeConfiguration()
        rd_kafka_conf_destroy(conf)
        // librdkafka checks the mechanism only when a client is created, after the start has
        // succeeded: a misspelt one would pass `--check`.
        if let mechanism = self["sasl.mechanisms"], !Self.saslMechanisms.contains(mechanism) {
            throw KafkaError(
                code: .invalidConfiguration,
                message:
                    "invalid value for property 'sasl.mechanisms' = '\(mechanism)': expected one of \(Self.saslMechanisms.joined(separator: ", "))"
            )
        }
    }

    /// The kind of client ``validateClient(_:)`` creates.
    public enum ClientKind: Sendable {
        case producer, consumer
    }

    /// Creates a client of `kind` with these properties but no brokers, and destroys it at once:
    /// the checks librdkafka makes only when a client is created (sizes that must agree, timeouts
    /// that must nest) run without connecting anywhere.
    public func validateClient(_ kind: ClientKind) throws(KafkaError) {
        var offline = self
        offline["bootstrap.servers"] = nil
        // Silent: it would warn on standard error, past the process's log format, of the missing brokers.
        offline["log_level"] = "0"
        let conf = try offline.makeNativeConfiguration()
        var errorText = [CChar](repeating: 0, count: 512)
        let type = kind == .producer ? RD_KAFKA_PRODUCER : RD_KAFKA_CONSUMER
        guard let handle = rd_kafka_new(type, conf, &errorText, errorText.count) else {
            // (On failure the configuration stays the caller's.)
            rd_kafka_conf_destroy(conf)
            var reason = String(cBuffer: errorText)
            for (key, value) in properties where Redaction.isSecret(key: key) {
                reason = Redaction.scrub(reason, secret: value)
            }
            throw KafkaError(code: .invalidConfiguration, message: "a \(kind) cannot be created: \(reason)")
        }
        rd_kafka_destroy(handle)
    }

    /// The SASL mechanisms librdkafka supports (`sasl.mechanisms`, case-sensitive).
    static let saslMechanisms = ["GSSAPI", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

    /// Builds an `rd_kafka_conf_t`; the caller owns it.
    func makeNativeConfiguration() throws(KafkaError) -> OpaquePointer {
        let conf = rd_kafka_conf_new()!
        var errorText = [CChar](repeating: 0, count: 512)
        for (key, value) in properties {
            let result = rd_kafka_conf_set(conf, key, value, &errorText, errorText.count)
            guard result == RD_KAFKA_CONF_OK else {
                rd_kafka_conf_destroy(conf)
                // librdkafka may echo the value; a secret (or a mistyped secret's key) never is.
                let reason = Redaction.scrub(String(cBuffer: errorText), secret: value)
                let message =
                    result == RD_KAFKA_CONF_UNKNOWN
                    ? "unknown property '\(key)' (its value is not shown): \(reason)"
                    : "invalid value for property '\(key)' = '\(Redaction.display(value, forKey: key))': \(reason)"
                throw KafkaError(code: .invalidConfiguration, message: message)
            }
        }
        return conf
    }
}

/// The librdkafka linked at run time: its version string and number (`0xMMmmrrxx`).
public enum LibrdkafkaVersion {
    public static var string: String { String(cString: rd_kafka_version_str()) }
    public static var number: Int { Int(rd_kafka_version()) }

    /// Whether the running librdkafka is at least `major.minor`.
    public static func isAtLeast(_ major: Int, _ minor: Int) -> Bool {
        number >= (major << 24) | (minor << 16)
    }
}

/// The process's librdkafka clients as a whole.
public enum KafkaClients {
    /// Waits up to `timeout` until every client is destroyed and librdkafka's threads have ended;
    /// returns whether they have. Before the process exits: a client still being destroyed on
    /// another thread when it exits crashed librdkafka 2.16 there.
    public static func waitUntilAllDestroyed(timeout: Duration) -> Bool {
        rd_kafka_wait_destroyed(Int32(clamping: timeout.milliseconds)) == 0
    }
}
