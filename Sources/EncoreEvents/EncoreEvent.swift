/// An event of the wire contract (`schemas/`): UTF-8 JSON, snake_case fields, `*_at_ms` times.
public protocol EncoreEvent: Sendable, Equatable {
    /// The CloudEvents `ce_type` of this event.
    static var eventType: EventType { get }

    /// Decodes and validates a record value; the error names the field at fault.
    init(jsonBytes: some Collection<UInt8>) throws(EventValidationError)

    /// The same, for a record value as a consumer hands it over. A type decoded per request
    /// implements it concretely: its decoding is then specialized in its own module, where a
    /// generic caller in another module runs it through generic metadata. (The generic one must
    /// not forward to this one with an array: the default here forwards to it with a slice.)
    init(jsonBytes: [UInt8]) throws(EventValidationError)

    /// Encodes the record value: compact JSON, fields in schema order, absent optionals omitted.
    func jsonBytes() -> [UInt8]
}

extension EncoreEvent {
    public init(jsonBytes: [UInt8]) throws(EventValidationError) {
        // (A slice: the generic requirement, not this one.)
        try self.init(jsonBytes: jsonBytes[...])
    }
}

/// The `ce_type` of each event of the contract.
public enum EventType: String, Sendable, CaseIterable {
    case purchaseRequested = "com.encorekit.purchase.requested.v1"
    case purchaseOutcome = "com.encorekit.purchase.outcome.v1"
    case entitlementChanged = "com.encorekit.entitlement.changed.v1"
    case entitlementSource = "com.encorekit.entitlement.source.v1"
    case entitlementState = "com.encorekit.entitlement.state.v1"
    case requestJournal = "com.encorekit.request.journal.v1"
    case deadLetter = "com.encorekit.deadletter.v1"
}

extension String {
    /// The first `limit` code points, as the contract's lengths count them: `self` when shorter.
    func prefix(codePoints limit: Int) -> String {
        let scalars = unicodeScalars
        guard let end = scalars.index(scalars.startIndex, offsetBy: limit, limitedBy: scalars.endIndex),
            end != scalars.endIndex
        else { return self }
        return String(scalars[..<end])
    }
}

/// Size limits of the contract, mirrored by `maxLength`/`maxProperties` in `schemas/`.
public enum EventLimits {
    /// Identifiers: request, app, user, product, placement, offer, campaign ids.
    public static let identifierLength = 256
    public static let attributeCount = 64
    public static let attributeKeyLength = 128
    public static let attributeValueLength = 1024
    public static let messageLength = 4096
    /// Largest record value the processor accepts, in bytes.
    public static let recordBytes = 64 * 1024
    /// Largest dead letter: it carries the original record (up to 256 KiB, base64 when binary) and
    /// its headers; Kafka's default `message.max.bytes`.
    public static let deadLetterBytes = 1024 * 1024
}

/// The user key of every record: `"{app_id}:{app_user_id}"`, so one user's records share a partition.
public func userKey(appID: String, appUserID: String) -> String {
    // Concatenated into one allocation (interpolation grows its buffer as it goes).
    var key = String()
    key.reserveCapacity(appID.utf8.count + 1 + appUserID.utf8.count)
    key += appID
    key += ":"
    key += appUserID
    return key
}
