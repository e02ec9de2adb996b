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
                    key: header.key.prefix(codePoints: 1024),
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
        self = try Self.table.decode(jsonBytes)
    }

    public func jsonBytes() -> [UInt8] { Self.table.encode(self) }

    /// Writes ``jsonBytes()``'s JSON into `writer` (a reused buffer).
    public func write(to writer: inout JSONWriter) { Self.table.write(self, to: &writer) }

    /// The original key's two wire fields; the table reads the text before its encoding.
    var originalKeyText: String? {
        get { originalKey?.text }
        set { originalKey = newValue.map { Payload(text: $0, encoding: .utf8) } }
    }

    var originalKeyEncoding: Payload.Encoding? {
        get { originalKey?.encoding }
        set { if let newValue { originalKey?.encoding = newValue } }
    }
}

extension DeadLetterEvent: FieldTabled {
    static let table = FieldTable<Self>(
        blank: Self(
            originalTopic: "", originalPartition: 0, originalOffset: 0,
            originalValue: Payload(text: "", encoding: .utf8),
            error: Failure(stage: .decode, errorClass: "", message: "", retryable: false), attempts: 0, failedAtMs: 0),
        byteLimit: EventLimits.deadLetterBytes,
        // A payload's text and encoding are two wire fields read in table order: no one-pass path.
        fastPath: false,
        capacity: { 512 + $0.originalValue.text.utf8.count },
        [
            .field("original_topic", \.originalTopic),
            .field("original_partition", \.originalPartition),
            .field("original_offset", \.originalOffset),
            .field("original_value", \.originalValue.text, .text()),
            .field("original_value_encoding", \.originalValue.encoding, whenAbsent: .utf8),
            .field("original_value_truncated", \.originalValueTruncated, whenAbsent: false, omittedWhen: false),
            .field("error", \.error),
            .field("attempts", \.attempts),
            .field("failed_at_ms", \.failedAtMs),
            .field("original_key", \.originalKeyText, .text()),
            .field("original_key_encoding", \.originalKeyEncoding),
            .field("original_key_truncated", \.originalKeyTruncated, whenAbsent: false, omittedWhen: false),
            .field("original_headers", \.originalHeaders, maximumOriginalHeaders),
            .field("original_headers_truncated", \.originalHeadersTruncated, whenAbsent: false, omittedWhen: false),
            .field("request_id", \.requestID),
        ])
}

extension DeadLetterEvent.Stage: FieldEnumeration {}
extension DeadLetterEvent.Payload.Encoding: FieldEnumeration {}

extension DeadLetterEvent.Failure: FieldTabled {
    /// The message as written: cut to the contract's limit, so the dead letter stays valid.
    var wireMessage: String {
        get { message.prefix(codePoints: EventLimits.messageLength) }
        set { message = newValue }
    }

    static let table = FieldTable<Self>(
        blank: Self(stage: .decode, errorClass: "", message: "", retryable: false),
        [
            .field("stage", \.stage),
            .field("class", \.errorClass, .name(maxLength: 128)),
            .field("message", \.wireMessage, .text(maxLength: EventLimits.messageLength)),
            .field("retryable", \.retryable),
            .field("field", \.field),
        ])
}

extension DeadLetterEvent.Header: FieldTabled {
    /// The value's two wire fields, as for the original key.
    var valueText: String? {
        get { value?.text }
        set { value = newValue.map { DeadLetterEvent.Payload(text: $0, encoding: .utf8) } }
    }

    var valueEncoding: DeadLetterEvent.Payload.Encoding? {
        get { value?.encoding }
        set { if let newValue { value?.encoding = newValue } }
    }

    static let table = FieldTable<Self>(
        blank: Self(key: "", value: nil), fastPath: false,
        [
            .field("key", \.key, .text(maxLength: 1024)),
            .field("value", \.valueText, .text()),
            .field("encoding", \.valueEncoding),
        ])
}
