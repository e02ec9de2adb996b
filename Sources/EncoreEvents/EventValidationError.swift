/// Why a record is not a valid event of the contract, and which field is at fault.
public struct EventValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kind of violation; callers switch on it, dead letters carry its name.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String

        public init(_ name: String) { self.name = name }

        public static let notUTF8 = Code("not_utf8")
        public static let notJSON = Code("not_json")
        public static let missingField = Code("missing_field")
        public static let wrongType = Code("wrong_type")
        public static let unknownEnumValue = Code("unknown_enum_value")
        public static let emptyValue = Code("empty_value")
        public static let tooLong = Code("too_long")
        public static let outOfRange = Code("out_of_range")
        public static let tooLarge = Code("too_large")
        public static let inconsistent = Code("inconsistent")
        public static let badFormat = Code("bad_format")

        public var description: String { name }
    }

    public var code: Code
    /// Dotted path of the offending field (`entitlement.unit`); empty for the record as a whole.
    public var field: String
    public var message: String

    public init(_ code: Code, field: String, _ message: String) {
        self.code = code
        self.field = field
        self.message = message
    }

    public var description: String {
        field.isEmpty ? "\(code): \(message)" : "\(code) at '\(field)': \(message)"
    }
}
