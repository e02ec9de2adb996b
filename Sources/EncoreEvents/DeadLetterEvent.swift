import Foundation

/// A record that could not be processed, with the reason and everything needed to replay it
/// (`com.encorekit.deadletter.v1`).
public struct DeadLetterEvent: EncoreEvent, Hashable {
    public static let eventType = EventType.deadLetter

    /// Where processing stopped.
    public enum Stage: String, Sendable, CaseIterable {
        /// The bytes are not UTF-8 JSON.
        case decode
        /// JSON, but not a valid event of the contract.
        case validate
        /// The controller failed (after retries, when retryable).
        case controller
        /// The outcome could not be published.
        case publish
    }

    /// Why the record was dead-lettered.
    public struct Failure: Sendable, Hashable {
        public var stage: Stage
        /// A stable error class, e.g. `missing_field`, `not_json`, `timeout`, `controller_error`.
        public var errorClass: String
        public var message: String
        public var retryable: Bool
        /// The offending field, for validation errors.
        public var field: String?

        public init(stage: Stage, errorClass: String, message: String, retryable: Bool, field: String? = nil) {
            self.stage = stage
            self.errorClass = errorClass
            self.message = message
            self.retryable = retryable
            self.field = field
        }

        /// The failure of a record the contract rejects.
        public init(_ error: EventValidationError) {
            let isDecode = error.code == .notUTF8 || error.code == .notJSON
            self.init(
                stage: isDecode ? .decode : .validate, errorClass: error.code.name, message: error.description,
                retryable: false, field: error.field.isEmpty ? nil : error.field)
        }
    }

    /// Bytes carried as text: UTF-8 when they are, base64 otherwise.
    public struct Payload: Sendable, Hashable {
        public enum Encoding: String, Sendable, CaseIterable {
            case utf8
            case base64
        }

        public var text: String
        public var encoding: Encoding

        public init(text: String, encoding: Encoding) {
            self.text = text
            self.encoding = encoding
        }

        public init(bytes: some Collection<UInt8>) {
            if let text = String(validating: bytes, as: UTF8.self) {
                self.init(text: text, encoding: .utf8)
            } else {
                self.init(text: Data(bytes).base64EncodedString(), encoding: .base64)
            }
        }

        /// The original bytes, or `nil` when base64 text is corrupt.
        public var bytes: [UInt8]? {
            switch encoding {
            case .utf8: Array(text.utf8)
            case .base64: Data(base64Encoded: text).map { Array($0) }
            }
        }
    }

    /// A header of the original record.
    public struct Header: Sendable, Hashable {
        public var key: String
        public var value: Payload?

        public init(key: String, value: Payload?) {
            self.key = key
            self.value = value
        }
    }

    /// Values longer than this many bytes are cut, so the dead letter itself stays producible.
    public static let maximumOriginalValueBytes = 256 * 1024
    /// Keys longer than this are cut (a user key is far shorter; anything longer is garbage).
    public static let maximumOriginalKeyBytes = 16 * 1024
    /// At most this many headers are kept, with keys of at most 1,024 characters and values of at
    /// most this many bytes in all: a hostile record's dead letter stays under 1 MiB.
    public static let maximumOriginalHeaders = 256
    public static let maximumOriginalHeaderBytes = 128 * 1024

    public var originalTopic: String
    public var originalPartition: Int32
    public var originalOffset: Int64
    public var originalValue: Payload
    /// The original value was longer than ``maximumOriginalValueBytes`` and was cut.
    public var originalValueTruncated: Bool
    public var error: Failure
    public var attempts: Int
    public var failedAtMs: Int64
    public var originalKey: Payload?
    /// The original key was longer than ``maximumOriginalKeyBytes`` and was cut.
    public var originalKeyTruncated: Bool
    public var originalHeaders: [Header]?
    /// Headers past ``maximumOriginalHeaders`` or ``maximumOriginalHeaderBytes`` were left out.
    public var originalHeadersTruncated: Bool
    public var requestID: String?

    public init(
        originalTopic: String, originalPartition: Int32, originalOffset: Int64, originalValue: Payload,
        originalValueTruncated: Bool = false, error: Failure, attempts: Int, failedAtMs: Int64,
        originalKey: Payload? = nil, originalKeyTruncated: Bool = false, originalHeaders: [Header]? = nil,
        originalHeadersTruncated: Bool = false, requestID: String? = nil
    ) {
        self.originalTopic = originalTopic
        self.originalPartition = originalPartition
        self.originalOffset = originalOffset
        self.originalValue = originalValue
        self.originalValueTruncated = originalValueTruncated
        self.error = error
        self.attempts = attempts
        self.failedAtMs = failedAtMs
        self.originalKey = originalKey
        self.originalKeyTruncated = originalKeyTruncated
        self.originalHeaders = originalHeaders
        self.originalHeadersTruncated = originalHeadersTruncated
        self.requestID = requestID
    }

    /// A dead letter for raw record bytes, cutting the value, the key and the headers past their
    /// limits (``maximumOriginalValueBytes`` and the others).
    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8],
        headers: [(key: String, value: [UInt8]?)], error: Failure, attempts: Int, failedAtMs: Int64,
        requestID: String? = nil
    ) {
        let truncated = value.count > Self.maximumOriginalValueBytes
        let keyTruncated = (key?.count ?? 0) > Self.maximumOriginalKeyBytes
        var kept: [Header] = []
        var budget = Self.maximumOriginalHeaderBytes
        for header in headers.prefix(Self.maximumOriginalHeaders) {
            let size = header.value?.count ?? 0
            guard size <= budget else { break }
            budget -= size
            kept.append(
                Header(
                    key: String(String.UnicodeScalarView(header.key.unicodeScalars.prefix(1024))),
                    value: header.value.map { Payload(bytes: $0) }))
        }
        self.init(
            originalTopic: topic, originalPartition: partition, originalOffset: offset,
            originalValue: Payload(bytes: truncated ? value.prefix(Self.maximumOriginalValueBytes) : value[...]),
            originalValueTruncated: truncated, error: error, attempts: attempts, failedAtMs: failedAtMs,
            originalKey: key.map { Payload(bytes: $0.prefix(Self.maximumOriginalKeyBytes)) },
            originalKeyTruncated: keyTruncated, originalHeaders: kept.isEmpty ? nil : kept,
            originalHeadersTruncated: kept.count < headers.count, requestID: requestID)
    }

    public init(jsonBytes: some Collection<UInt8>) throws(EventValidationError) {
        self = try Self.decode(jsonBytes, limit: EventLimits.deadLetterBytes) { (json) throws(EventValidationError) in
            let failure = try json.object("error")
            var headers: [Header]? = nil
            if let items = try json.optionalArray("original_headers", maxItems: 256) {
                headers = []
                for (index, item) in items.enumerated() {
                    let header = try JSONFieldReader(item, path: "original_headers.\(index)")
                    let value = try header.optionalString("value", maxLength: Int.max, allowEmpty: true).map {
                        (text) throws(EventValidationError) in
                        Payload(text: text, encoding: try header.optionalEnumeration("encoding") ?? .utf8)
                    }
                    headers?.append(
                        Header(key: try header.string("key", maxLength: 1024, allowEmpty: true), value: value))
                }
            }
            let key = try json.optionalString("original_key", maxLength: Int.max, allowEmpty: true).map {
                (text) throws(EventValidationError) in
                Payload(text: text, encoding: try json.optionalEnumeration("original_key_encoding") ?? .utf8)
            }
            return try DeadLetterEvent(
                originalTopic: json.string("original_topic"),
                originalPartition: Int32(clamping: json.int64("original_partition")),
                originalOffset: json.int64("original_offset"),
                originalValue: Payload(
                    text: json.string("original_value", maxLength: Int.max, allowEmpty: true),
                    encoding: json.optionalEnumeration("original_value_encoding") ?? .utf8),
                originalValueTruncated: json.optionalBool("original_value_truncated") ?? false,
                error: Failure(
                    stage: failure.enumeration("stage"), errorClass: failure.string("class", maxLength: 128),
                    message: failure.string("message", maxLength: EventLimits.messageLength, allowEmpty: true),
                    retryable: failure.bool("retryable"), field: failure.optionalString("field")),
                attempts: Int(json.int64("attempts")), failedAtMs: json.int64("failed_at_ms"), originalKey: key,
                originalKeyTruncated: json.optionalBool("original_key_truncated") ?? false, originalHeaders: headers,
                originalHeadersTruncated: json.optionalBool("original_headers_truncated") ?? false,
                requestID: json.optionalString("request_id"))
        }
    }

    public func jsonBytes() -> [UInt8] {
        var writer = JSONWriter(capacity: 512 + originalValue.text.utf8.count)
        writer.beginObject()
        writer.field("original_topic", originalTopic)
        writer.field("original_partition", Int64(originalPartition))
        writer.field("original_offset", originalOffset)
        writer.field("original_value", originalValue.text)
        writer.field("original_value_encoding", originalValue.encoding)
        if originalValueTruncated { writer.field("original_value_truncated", true) }
        writer.key("error")
        writer.beginObject()
        writer.field("stage", error.stage)
        writer.field("class", error.errorClass)
        writer.field(
            "message", String(String.UnicodeScalarView(error.message.unicodeScalars.prefix(EventLimits.messageLength))))
        writer.field("retryable", error.retryable)
        writer.field("field", error.field)
        writer.endObject()
        writer.field("attempts", attempts)
        writer.field("failed_at_ms", failedAtMs)
        if let originalKey {
            writer.field("original_key", originalKey.text)
            writer.field("original_key_encoding", originalKey.encoding)
        }
        if originalKeyTruncated { writer.field("original_key_truncated", true) }
        if let originalHeaders {
            writer.key("original_headers")
            writer.beginArray()
            for header in originalHeaders {
                writer.beginObject()
                writer.field("key", header.key)
                if let value = header.value {
                    writer.field("value", value.text)
                    writer.field("encoding", value.encoding)
                }
                writer.endObject()
            }
            writer.endArray()
        }
        if originalHeadersTruncated { writer.field("original_headers_truncated", true) }
        writer.field("request_id", requestID)
        writer.endObject()
        return writer.bytes
    }
}
