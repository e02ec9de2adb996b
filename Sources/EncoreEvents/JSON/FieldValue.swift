/// A value a ``Field`` can hold: how the general decoder and the fast path read it, how it is
/// written, and its wire form, each under the field's `Rule` (a string's limits, an integer's minimum).
protocol FieldValue: Sendable, Equatable {
    associatedtype Rule: Sendable
    static var defaultRule: Rule { get }
    /// The value of `key`, `nil` when absent or `null`; throws when it breaks the rule.
    static func read(_ key: String, from reader: JSONFieldReader, _ rule: Rule) throws(EventValidationError) -> Self?
    /// The value at the scanner, or `nil` to leave the record to the general decoder.
    static func scan(_ scanner: inout JSONScanner, _ rule: Rule) -> Self?
    func write(to writer: inout JSONWriter, _ rule: Rule)
    static func shape(_ rule: Rule) -> FieldShape
}

// MARK: Strings

/// A string's limits; lengths count code points, as JSON Schema's do.
struct StringRule: Sendable {
    /// `nil`: no limit.
    var maxLength: Int?
    var allowEmpty = false
    var pattern: StringPattern?

    /// Request, app, user, product, placement, offer and campaign ids.
    static let identifier = StringRule(maxLength: EventLimits.identifierLength)
    /// An app id: an identifier without `:`, so that a user's key `{app_id}:{app_user_id}` names
    /// one user only (it splits at its first `:`).
    static let appID = StringRule(maxLength: EventLimits.identifierLength, pattern: .appID)
    /// A request's content digest in the journal.
    static let digest = StringRule(maxLength: 16, pattern: .hexDigits)
    /// Error and controller names, source and rule names: non-empty, at most `maxLength`.
    static func name(maxLength: Int) -> StringRule { StringRule(maxLength: maxLength) }
    /// Free text, possibly empty.
    static func text(maxLength: Int? = nil) -> StringRule { StringRule(maxLength: maxLength, allowEmpty: true) }
}

/// Which characters a string may hold, with the schema's `pattern` stating the same.
struct StringPattern: Sendable {
    let pattern: String
    let description: String
    let allows: @Sendable (UInt8) -> Bool

    /// A content digest: 16 lowercase hex digits.
    static let hexDigits = StringPattern(
        pattern: "^[0-9a-f]+$", description: "lowercase hex digits",
        allows: { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) })

    /// An app id: any character but `:`.
    static let appID = StringPattern(
        pattern: "^[^:]+$", description: "characters other than ':' (a user's key is '{app_id}:{app_user_id}')",
        allows: { $0 != UInt8(ascii: ":") })

    /// A source's name (`revenuecat`): letters, digits, `_`, `.` and `-`.
    static let sourceName = StringPattern(
        pattern: "^[A-Za-z0-9_.-]+$", description: "letters, digits, '_', '.' and '-'",
        allows: { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
        })
}

extension String: FieldValue {
    static var defaultRule: StringRule { .identifier }

    static func read(_ key: String, from reader: JSONFieldReader, _ rule: StringRule) throws(EventValidationError)
        -> String?
    {
        guard
            let text = try reader.optionalString(
                key, maxLength: rule.maxLength ?? Int.max, allowEmpty: rule.allowEmpty)
        else { return nil }
        if let pattern = rule.pattern, !text.utf8.allSatisfy(pattern.allows) {
            throw EventValidationError(
                .badFormat, field: reader.fieldPath(key),
                "'\(reader.fieldPath(key))' may hold only \(pattern.description)")
        }
        return text
    }

    static func scan(_ scanner: inout JSONScanner, _ rule: StringRule) -> String? {
        // The fast path reads ASCII only: a byte is a code point.
        guard let raw = scanner.rawString(), raw.count <= rule.maxLength ?? Int.max, rule.allowEmpty || !raw.isEmpty
        else { return nil }
        if let pattern = rule.pattern, !raw.allSatisfy(pattern.allows) { return nil }
        return String(decoding: raw, as: UTF8.self)
    }

    func write(to writer: inout JSONWriter, _ rule: StringRule) { writer.string(self) }

    static func shape(_ rule: StringRule) -> FieldShape {
        .string(minLength: rule.allowEmpty ? 0 : 1, maxLength: rule.maxLength, pattern: rule.pattern?.pattern)
    }
}

// MARK: Numbers and booleans

/// Integers: the rule is the minimum.
protocol IntegerFieldValue: FieldValue, FixedWidthInteger where Rule == Int64 {}

extension IntegerFieldValue {
    static var defaultRule: Int64 { 0 }

    static func read(_ key: String, from reader: JSONFieldReader, _ minimum: Int64) throws(EventValidationError)
        -> Self?
    {
        try reader.optionalInt64(key, minimum: minimum).map { Self(clamping: $0) }
    }

    static func scan(_ scanner: inout JSONScanner, _ minimum: Int64) -> Self? {
        guard let value = scanner.integer(), value >= minimum else { return nil }
        return Self(exactly: value)
    }

    func write(to writer: inout JSONWriter, _ minimum: Int64) { writer.integer(Int64(self)) }

    static func shape(_ minimum: Int64) -> FieldShape { .integer(minimum: minimum) }
}

extension Int64: IntegerFieldValue {}
extension Int: IntegerFieldValue {}
extension Int32: IntegerFieldValue {}

/// Numbers: the rule is the range allowed.
extension Double: FieldValue {
    static var defaultRule: ClosedRange<Double> { 0...1_000_000 }

    static func read(_ key: String, from reader: JSONFieldReader, _ range: ClosedRange<Double>)
        throws(EventValidationError) -> Double?
    {
        try reader.optionalDouble(key, minimum: range.lowerBound, maximum: range.upperBound)
    }

    static func scan(_ scanner: inout JSONScanner, _ range: ClosedRange<Double>) -> Double? {
        guard let value = scanner.number(), range.contains(value) else { return nil }
        return value
    }

    func write(to writer: inout JSONWriter, _ range: ClosedRange<Double>) { writer.number(self) }

    static func shape(_ range: ClosedRange<Double>) -> FieldShape {
        .number(minimum: range.lowerBound, maximum: range.upperBound)
    }
}

extension Bool: FieldValue {
    static var defaultRule: Void { () }

    static func read(_ key: String, from reader: JSONFieldReader, _ rule: Void) throws(EventValidationError) -> Bool? {
        try reader.optionalBool(key)
    }

    static func scan(_ scanner: inout JSONScanner, _ rule: Void) -> Bool? { scanner.bool() }

    func write(to writer: inout JSONWriter, _ rule: Void) { writer.bool(self) }

    static func shape(_ rule: Void) -> FieldShape { .boolean }
}

// MARK: Enumerations

/// A closed set of strings (`store`, `result`): any other value is an error naming the allowed ones.
protocol FieldEnumeration: FieldValue, RawRepresentable<String>, CaseIterable where Rule == Void {}

extension FieldEnumeration {
    static var defaultRule: Void { () }

    static func read(_ key: String, from reader: JSONFieldReader, _ rule: Void) throws(EventValidationError) -> Self? {
        try reader.optionalEnumeration(key, as: Self.self)
    }

    static func scan(_ scanner: inout JSONScanner, _ rule: Void) -> Self? {
        guard let raw = scanner.rawString() else { return nil }
        return Self(rawValue: String(decoding: raw, as: UTF8.self))
    }

    func write(to writer: inout JSONWriter, _ rule: Void) { writer.string(rawValue) }

    static func shape(_ rule: Void) -> FieldShape { .enumeration(allCases.map(\.rawValue)) }
}

extension Store: FieldEnumeration {}
extension PurchaseEnvironment: FieldEnumeration {}
extension OutcomeResult: FieldEnumeration {}
extension PendingReason: FieldEnumeration {}
extension EntitlementType: FieldEnumeration {}
extension EntitlementUnit: FieldEnumeration {}
extension EntitlementStatus: FieldEnumeration {}
extension EntitlementChangeKind: FieldEnumeration {}

// MARK: Objects, arrays and maps

extension FieldTabled {
    static var defaultRule: Void { () }

    static func read(_ key: String, from reader: JSONFieldReader, _ rule: Void) throws(EventValidationError) -> Self? {
        try reader.optionalObject(key).map { (object) throws(EventValidationError) in try table.read(object) }
    }

    static func scan(_ scanner: inout JSONScanner, _ rule: Void) -> Self? {
        table.fastPath ? table.scan(&scanner) : nil
    }

    func write(to writer: inout JSONWriter, _ rule: Void) { Self.table.write(self, to: &writer) }

    static func shape(_ rule: Void) -> FieldShape { .object(table.schema) }
}

/// An array of objects: the rule is the most items allowed.
extension Array: FieldValue where Element: FieldTabled {
    static var defaultRule: Int { 1000 }

    static func read(_ key: String, from reader: JSONFieldReader, _ maxItems: Int) throws(EventValidationError)
        -> [Element]?
    {
        guard let items = try reader.optionalArray(key, maxItems: maxItems) else { return nil }
        var values: [Element] = []
        values.reserveCapacity(items.count)
        for (index, item) in items.enumerated() {
            values.append(try Element.table.read(JSONFieldReader(item, path: "\(reader.fieldPath(key)).\(index)")))
        }
        return values
    }

    static func scan(_ scanner: inout JSONScanner, _ maxItems: Int) -> [Element]? {
        var values: [Element] = []
        let table = Element.table
        let complete = scanner.array { scanner in
            guard values.count < maxItems, let value = table.scan(&scanner) else { return false }
            values.append(value)
            return true
        }
        return complete ? values : nil
    }

    func write(to writer: inout JSONWriter, _ maxItems: Int) {
        writer.beginArray()
        let table = Element.table
        withUnsafeBufferPointer { items in
            for index in items.indices { table.write(at: items.baseAddress! + index, to: &writer) }
        }
        writer.endArray()
    }

    static func shape(_ maxItems: Int) -> FieldShape { .array(maxItems: maxItems, items: Element.table.schema) }
}

/// A string-to-string map's limits (a request's `attributes`).
struct MapRule: Sendable {
    var maxEntries: Int
    var maxKeyLength: Int
    var maxValueLength: Int

    static let attributes = MapRule(
        maxEntries: EventLimits.attributeCount, maxKeyLength: EventLimits.attributeKeyLength,
        maxValueLength: EventLimits.attributeValueLength)
}

extension Dictionary: FieldValue where Key == String, Value == String {
    static var defaultRule: MapRule { .attributes }

    static func read(_ key: String, from reader: JSONFieldReader, _ rule: MapRule) throws(EventValidationError)
        -> [String: String]?
    {
        try reader.optionalStringMap(
            key, maxEntries: rule.maxEntries, maxKeyLength: rule.maxKeyLength, maxValueLength: rule.maxValueLength)
    }

    static func scan(_ scanner: inout JSONScanner, _ rule: MapRule) -> [String: String]? {
        var map: [String: String] = [:]
        let complete = scanner.object { scanner, name in
            guard name.count <= rule.maxKeyLength, let value = scanner.rawString(), value.count <= rule.maxValueLength,
                map.updateValue(String(decoding: value, as: UTF8.self), forKey: String(decoding: name, as: UTF8.self))
                    == nil, map.count <= rule.maxEntries
            else { return false }
            return true
        }
        return complete ? map : nil
    }

    func write(to writer: inout JSONWriter, _ rule: MapRule) {
        writer.beginObject()
        if count == 1, let (name, value) = first {
            // (One entry needs no sorted copy.)
            writer.key(dynamic: name)
            writer.string(value)
        } else {
            for (name, value) in sorted(by: { $0.key < $1.key }) {
                writer.key(dynamic: name)
                writer.string(value)
            }
        }
        writer.endObject()
    }

    static func shape(_ rule: MapRule) -> FieldShape {
        .stringMap(maxProperties: rule.maxEntries, maxKeyLength: rule.maxKeyLength, maxValueLength: rule.maxValueLength)
    }
}
