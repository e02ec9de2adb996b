/// Decodes the common shape of a purchase request in one pass over its bytes, without building a
/// JSON tree: ASCII, no escapes, known fields once each, every value of the right type and within
/// its limits. Anything else (an error, an unknown field, an escape, a float where an integer is
/// expected) returns `nil`, and the general decoder decides, so errors and edge cases are exactly
/// the general decoder's. A test checks that both agree wherever this one answers.
struct PurchaseRequestFastDecoder {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0

    private init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    static func decode(_ bytes: UnsafeBufferPointer<UInt8>) -> PurchaseRequestEvent? {
        guard bytes.count <= EventLimits.recordBytes, isASCII(bytes) else { return nil }
        var decoder = PurchaseRequestFastDecoder(bytes)
        return decoder.request()
    }

    private enum Field: Int {
        case requestID, appID, appUserID, productID, store, environment, requestedAtMs, placementID
        case promoOfferID, campaignID, offerID, entitlement, deadlineAtMs, attributes
    }

    private static let fields: [(name: [UInt8], field: Field)] =
        ([
            ("request_id", .requestID), ("app_id", .appID), ("app_user_id", .appUserID), ("product_id", .productID),
            ("store", .store), ("environment", .environment), ("requested_at_ms", .requestedAtMs),
            ("placement_id", .placementID), ("promo_offer_id", .promoOfferID), ("campaign_id", .campaignID),
            ("offer_id", .offerID), ("entitlement", .entitlement), ("deadline_at_ms", .deadlineAtMs),
            ("attributes", .attributes),
        ] as [(String, Field)]).map { (Array($0.0.utf8), $0.1) }

    private mutating func request() -> PurchaseRequestEvent? {
        var requestID: String?
        var appID: String?
        var appUserID: String?
        var productID: String?
        var store: Store?
        var environment: PurchaseEnvironment?
        var requestedAtMs: Int64?
        var placementID: String?
        var promoOfferID: String?
        var campaignID: String?
        var offerID: String?
        var entitlement: Entitlement?
        var deadlineAtMs: Int64?
        var attributes: [String: String]?
        var seen: UInt32 = 0
        skipWhitespace()
        guard consume(UInt8(ascii: "{")) else { return nil }
        skipWhitespace()
        if !consume(UInt8(ascii: "}")) {
            repeat {
                skipWhitespace()
                guard let field = fieldName() else { return nil }
                // A repeated field: the general decoder decides which value counts.
                guard seen & (1 << field.rawValue) == 0 else { return nil }
                seen |= 1 << field.rawValue
                skipWhitespace()
                guard consume(UInt8(ascii: ":")) else { return nil }
                skipWhitespace()
                // Every field read must give a value; otherwise the general decoder decides.
                let read: Bool
                switch field {
                case .requestID: (requestID, read) = Self.given(identifier())
                case .appID: (appID, read) = Self.given(identifier())
                case .appUserID: (appUserID, read) = Self.given(identifier())
                case .productID: (productID, read) = Self.given(identifier())
                case .store: (store, read) = Self.given(enumeration())
                case .environment: (environment, read) = Self.given(enumeration())
                case .requestedAtMs: (requestedAtMs, read) = Self.given(integer())
                case .placementID: (placementID, read) = Self.given(identifier())
                case .promoOfferID: (promoOfferID, read) = Self.given(identifier())
                case .campaignID: (campaignID, read) = Self.given(identifier())
                case .offerID: (offerID, read) = Self.given(identifier())
                case .entitlement: (entitlement, read) = Self.given(self.entitlement())
                case .deadlineAtMs: (deadlineAtMs, read) = Self.given(integer())
                case .attributes: (attributes, read) = Self.given(self.attributes())
                }
                guard read else { return nil }
                skipWhitespace()
            } while consume(UInt8(ascii: ","))
            guard consume(UInt8(ascii: "}")) else { return nil }
        }
        skipWhitespace()
        guard index == bytes.count, let requestID, let appID, let appUserID, let productID, let store, let environment,
            let requestedAtMs
        else { return nil }
        return PurchaseRequestEvent(
            requestID: requestID, appID: appID, appUserID: appUserID, productID: productID, store: store,
            environment: environment, requestedAtMs: requestedAtMs, placementID: placementID,
            promoOfferID: promoOfferID, campaignID: campaignID, offerID: offerID, entitlement: entitlement,
            deadlineAtMs: deadlineAtMs, attributes: attributes)
    }

    // MARK: Values

    /// A value read and whether there was one.
    private static func given<T>(_ value: T?) -> (T?, Bool) { (value, value != nil) }

    /// The bytes of a string without escapes or control characters, the index past its closing quote.
    private mutating func rawString() -> UnsafeBufferPointer<UInt8>? {
        guard consume(UInt8(ascii: "\"")) else { return nil }
        let start = index
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
                index += 1
                return text
            }
            guard byte >= 0x20, byte != UInt8(ascii: "\\") else { return nil }
            index += 1
        }
        return nil
    }

    private mutating func string(maxLength: Int, allowEmpty: Bool) -> String? {
        guard let raw = rawString(), raw.count <= maxLength, allowEmpty || !raw.isEmpty else { return nil }
        return String(decoding: raw, as: UTF8.self)
    }

    private mutating func identifier() -> String? {
        string(maxLength: EventLimits.identifierLength, allowEmpty: false)
    }

    private mutating func enumeration<E: RawRepresentable<String>>() -> E? {
        guard let raw = rawString() else { return nil }
        return E(rawValue: String(decoding: raw, as: UTF8.self))
    }

    /// A non-negative integer written with digits only (at most 18 of them).
    private mutating func integer() -> Int64? {
        let start = index
        var value: Int64 = 0
        while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
            // Eighteen digits cannot overflow; longer numbers are left to the general decoder.
            guard index - start < 18 else { return nil }
            value = value * 10 + Int64(bytes[index] - UInt8(ascii: "0"))
            index += 1
        }
        let digits = index - start
        guard digits > 0, digits <= 18, digits == 1 || bytes[start] != UInt8(ascii: "0"), !atNumberContinuation()
        else { return nil }
        return value
    }

    /// A fraction or exponent follows: not an integer of the simple kind.
    private func atNumberContinuation() -> Bool {
        guard index < bytes.count else { return false }
        let byte = bytes[index]
        return byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
    }

    private mutating func entitlement() -> Entitlement? {
        guard consume(UInt8(ascii: "{")) else { return nil }
        var type: EntitlementType?
        var value: Double?
        var unit: EntitlementUnit?
        repeat {
            skipWhitespace()
            guard let name = rawString() else { return nil }
            skipWhitespace()
            guard consume(UInt8(ascii: ":")) else { return nil }
            skipWhitespace()
            switch String(decoding: name, as: UTF8.self) {
            case "type" where type == nil:
                guard let parsed: EntitlementType = enumeration() else { return nil }
                type = parsed
            case "unit" where unit == nil:
                guard let parsed: EntitlementUnit = enumeration() else { return nil }
                unit = parsed
            case "value" where value == nil:
                guard let parsed = number(), parsed >= 0, parsed <= 1_000_000 else { return nil }
                value = parsed
            default:
                return nil
            }
            skipWhitespace()
        } while consume(UInt8(ascii: ","))
        guard consume(UInt8(ascii: "}")), let type, let value, let unit else { return nil }
        return Entitlement(type: type, value: value, unit: unit)
    }

    /// A plain decimal number (digits, an optional fraction; no sign, no exponent).
    private mutating func number() -> Double? {
        let start = index
        while index < bytes.count, isNumberByte(bytes[index]) { index += 1 }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard !text.isEmpty, text.first != ".", text.last != ".", text.filter({ $0 == "." }).count <= 1,
            !(text.count > 1 && text.hasPrefix("0") && !text.hasPrefix("0."))
        else { return nil }
        return Double(text)
    }

    private func isNumberByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: ".")
    }

    private mutating func attributes() -> [String: String]? {
        guard consume(UInt8(ascii: "{")) else { return nil }
        var attributes: [String: String] = [:]
        skipWhitespace()
        if consume(UInt8(ascii: "}")) { return attributes }
        repeat {
            skipWhitespace()
            guard let name = string(maxLength: EventLimits.attributeKeyLength, allowEmpty: true) else { return nil }
            skipWhitespace()
            guard consume(UInt8(ascii: ":")) else { return nil }
            skipWhitespace()
            guard let value = string(maxLength: EventLimits.attributeValueLength, allowEmpty: true),
                attributes.updateValue(value, forKey: name) == nil, attributes.count <= EventLimits.attributeCount
            else { return nil }
            skipWhitespace()
        } while consume(UInt8(ascii: ","))
        guard consume(UInt8(ascii: "}")) else { return nil }
        return attributes
    }

    // MARK: Tokens

    private mutating func fieldName() -> Field? {
        guard let name = rawString() else { return nil }
        for entry in Self.fields where entry.name.count == name.count && entry.name.elementsEqual(name) {
            return entry.field
        }
        return nil
    }

    private mutating func consume(_ byte: UInt8) -> Bool {
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return
            }
        }
    }
}
