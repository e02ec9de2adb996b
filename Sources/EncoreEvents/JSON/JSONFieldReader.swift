/// Reads typed, validated fields of one JSON object; errors name the field's dotted path.
struct JSONFieldReader {
    let fields: [String: JSONValue]
    let path: String

    init(_ value: JSONValue, path: String = "") throws(EventValidationError) {
        guard case .object(let fields) = value else {
            throw EventValidationError(
                .wrongType, field: path,
                path.isEmpty
                    ? "expected an object, got \(value.typeName)" : "'\(path)' must be an object, got \(value.typeName)"
            )
        }
        self.fields = fields
        self.path = path
    }

    func fieldPath(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// The field's value; an explicit `null` is absent (Python's `None`, Jackson's and Go's
    /// defaults), as the schemas say for optional fields.
    private func present(_ key: String) -> JSONValue? {
        guard let value = fields[key], value != .null else { return nil }
        return value
    }

    func missing(_ key: String) -> EventValidationError {
        if fields[key] == .null {
            return EventValidationError(
                .wrongType, field: fieldPath(key), "required field '\(fieldPath(key))' must not be null")
        }
        return EventValidationError(
            .missingField, field: fieldPath(key), "required field '\(fieldPath(key))' is missing")
    }

    private func wrongType(_ key: String, _ expected: String, _ value: JSONValue) -> EventValidationError {
        EventValidationError(
            .wrongType, field: fieldPath(key), "'\(fieldPath(key))' must be \(expected), got \(value.typeName)")
    }

    func string(_ key: String, maxLength: Int = 256, allowEmpty: Bool = false) throws(EventValidationError) -> String {
        guard let value = try optionalString(key, maxLength: maxLength, allowEmpty: allowEmpty) else {
            throw missing(key)
        }
        return value
    }

    func optionalString(
        _ key: String, maxLength: Int = 256, allowEmpty: Bool = false
    ) throws(EventValidationError) -> String? {
        guard let value = present(key) else { return nil }
        guard case .string(let text) = value else { throw wrongType(key, "a string", value) }
        if !allowEmpty && text.isEmpty {
            throw EventValidationError(.emptyValue, field: fieldPath(key), "'\(fieldPath(key))' must not be empty")
        }
        // JSON Schema's maxLength counts code points.
        if text.utf8.count > maxLength, text.unicodeScalars.count > maxLength {
            throw EventValidationError(
                .tooLong, field: fieldPath(key),
                "'\(fieldPath(key))' is \(text.unicodeScalars.count) characters, at most \(maxLength) allowed")
        }
        return text
    }

    func optionalInt64(_ key: String, minimum: Int64 = 0) throws(EventValidationError) -> Int64? {
        guard let value = present(key) else { return nil }
        let integer: Int64
        switch value {
        case .integer(let exact): integer = exact
        case .double(let double) where double.rounded() == double && abs(double) < 9.0e18: integer = Int64(double)
        default: throw wrongType(key, "an integer", value)
        }
        guard integer >= minimum else {
            throw EventValidationError(
                .outOfRange, field: fieldPath(key), "'\(fieldPath(key))' is \(integer), must be at least \(minimum)")
        }
        return integer
    }

    func optionalDouble(_ key: String, minimum: Double, maximum: Double) throws(EventValidationError) -> Double? {
        guard let value = present(key) else { return nil }
        let number: Double
        switch value {
        case .integer(let exact): number = Double(exact)
        case .double(let double): number = double
        default: throw wrongType(key, "a number", value)
        }
        guard number >= minimum, number <= maximum else {
            throw EventValidationError(
                .outOfRange, field: fieldPath(key),
                "'\(fieldPath(key))' is \(number), must be between \(minimum) and \(maximum)")
        }
        return number
    }

    func bool(_ key: String) throws(EventValidationError) -> Bool {
        guard let value = present(key) else { throw missing(key) }
        guard case .bool(let flag) = value else { throw wrongType(key, "a boolean", value) }
        return flag
    }

    func optionalBool(_ key: String) throws(EventValidationError) -> Bool? {
        guard present(key) != nil else { return nil }
        return try bool(key)
    }

    func optionalEnumeration<E: RawRepresentable<String> & CaseIterable>(
        _ key: String, as type: E.Type = E.self
    ) throws(EventValidationError) -> E? {
        guard let value = present(key) else { return nil }
        guard case .string(let text) = value else { throw wrongType(key, "a string", value) }
        guard let parsed = E(rawValue: text) else {
            let allowed = E.allCases.map { "'\($0.rawValue)'" }.joined(separator: ", ")
            throw EventValidationError(
                .unknownEnumValue, field: fieldPath(key),
                "'\(fieldPath(key))' has unknown value '\(text.prefix(64))', expected one of \(allowed)")
        }
        return parsed
    }

    func optionalObject(_ key: String) throws(EventValidationError) -> JSONFieldReader? {
        guard let value = present(key) else { return nil }
        return try JSONFieldReader(value, path: fieldPath(key))
    }

    func optionalArray(_ key: String, maxItems: Int) throws(EventValidationError) -> [JSONValue]? {
        guard let value = present(key) else { return nil }
        guard case .array(let items) = value else { throw wrongType(key, "an array", value) }
        guard items.count <= maxItems else {
            throw EventValidationError(
                .tooLarge, field: fieldPath(key), "'\(fieldPath(key))' has \(items.count) items, at most \(maxItems)")
        }
        return items
    }

    /// A string-to-string map with bounded size, key and value lengths.
    func optionalStringMap(
        _ key: String, maxEntries: Int, maxKeyLength: Int, maxValueLength: Int
    ) throws(EventValidationError) -> [String: String]? {
        guard let map = try optionalObject(key) else { return nil }
        guard map.fields.count <= maxEntries else {
            throw EventValidationError(
                .tooLarge, field: fieldPath(key),
                "'\(fieldPath(key))' has \(map.fields.count) entries, at most \(maxEntries)")
        }
        var result: [String: String] = [:]
        for name in map.fields.keys.sorted() {
            if name.unicodeScalars.count > maxKeyLength {
                throw EventValidationError(
                    .tooLong, field: fieldPath(key), "a key of '\(fieldPath(key))' is longer than \(maxKeyLength)")
            }
            result[name] = try map.string(name, maxLength: maxValueLength, allowEmpty: true)
        }
        return result
    }
}
