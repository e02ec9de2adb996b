/// A parsed JSON document. Integers that fit `Int64` are kept exact.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case integer(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// The JSON type name used in error messages, as JSON Schema spells it.
    var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "boolean"
        case .integer: "integer"
        case .double: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    /// Parses UTF-8 JSON text; invalid UTF-8 and invalid JSON are reported as such.
    public static func parse(_ bytes: some Collection<UInt8>) throws(EventValidationError) -> JSONValue {
        let result: Result<JSONValue, EventValidationError>? = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(EventValidationError) in
                var parser = JSONParser(buffer)
                return try parser.parseDocument()
            }
        }
        if let result { return try result.get() }
        let copy = Array(bytes)
        return try copy.withUnsafeBufferPointer { buffer throws(EventValidationError) in
            var parser = JSONParser(buffer)
            return try parser.parseDocument()
        }
    }
}

/// Whether every byte is ASCII; eight bytes at a time.
func isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
    var index = 0
    var highBits: UInt64 = 0
    if let base = bytes.baseAddress {
        let raw = UnsafeRawPointer(base)
        while index + 8 <= bytes.count {
            highBits |= raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            index += 8
        }
    }
    while index < bytes.count {
        highBits |= UInt64(bytes[index])
        index += 1
    }
    return highBits & 0x8080_8080_8080_8080 == 0
}

/// A recursive-descent JSON parser (RFC 8259) over a byte buffer.
struct JSONParser {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    private var depth = 0
    private static let maximumDepth = 64

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    mutating func parseDocument() throws(EventValidationError) -> JSONValue {
        guard validateUTF8() else {
            throw EventValidationError(.notUTF8, field: "", "the record value is not valid UTF-8")
        }
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        guard index == bytes.count else { throw syntax("unexpected data after the JSON value") }
        return value
    }

    private func validateUTF8() -> Bool {
        // ASCII is valid UTF-8.
        if isASCII(bytes) { return true }
        return String(validating: bytes, as: UTF8.self) != nil
    }

    private func syntax(_ message: String) -> EventValidationError {
        EventValidationError(.notJSON, field: "", "not valid JSON at byte \(index): \(message)")
    }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return
            }
        }
    }

    private mutating func parseValue() throws(EventValidationError) -> JSONValue {
        guard index < bytes.count else { throw syntax("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw syntax("unexpected character '\(Unicode.Scalar(bytes[index]))'")
        }
    }

    private mutating func expectLiteral(_ literal: StaticString) throws(EventValidationError) {
        let count = literal.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw syntax("unexpected end of input") }
        for offset in 0..<count where bytes[index + offset] != literal.utf8Start[offset] {
            throw syntax("invalid literal")
        }
        index += count
    }

    private mutating func enter() throws(EventValidationError) {
        depth += 1
        guard depth <= JSONParser.maximumDepth else { throw syntax("nesting deeper than \(JSONParser.maximumDepth)") }
    }

    private mutating func parseObject() throws(EventValidationError) -> JSONValue {
        try enter()
        defer { depth -= 1 }
        index += 1
        // Events have around fifteen fields: growing from empty would reallocate four times.
        var object = [String: JSONValue](minimumCapacity: 16)
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(object)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw syntax("expected a field name") }
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw syntax("expected ':'") }
            index += 1
            skipWhitespace()
            object[key] = try parseValue()
            skipWhitespace()
            guard index < bytes.count else { throw syntax("unexpected end of input in an object") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(object)
            } else {
                throw syntax("expected ',' or '}'")
            }
        }
    }

    private mutating func parseArray() throws(EventValidationError) -> JSONValue {
        try enter()
        defer { depth -= 1 }
        index += 1
        var array: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(array)
        }
        while true {
            skipWhitespace()
            array.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw syntax("unexpected end of input in an array") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(array)
            } else {
                throw syntax("expected ',' or ']'")
            }
        }
    }

    private mutating func parseString() throws(EventValidationError) -> String {
        index += 1
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            guard byte >= 0x20 else { throw syntax("control character in a string") }
            index += 1
        }
        var scalars = Array(UnsafeBufferPointer(rebasing: bytes[start..<min(index, bytes.count)]))
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return String(decoding: scalars, as: UTF8.self)
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw syntax("unterminated escape") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scalars.append(escape)
                case UInt8(ascii: "b"): scalars.append(0x08)
                case UInt8(ascii: "f"): scalars.append(0x0C)
                case UInt8(ascii: "n"): scalars.append(0x0A)
                case UInt8(ascii: "r"): scalars.append(0x0D)
                case UInt8(ascii: "t"): scalars.append(0x09)
                case UInt8(ascii: "u"):
                    var code = try parseHex4()
                    if (0xD800..<0xDC00).contains(code) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u")
                        else { throw syntax("unpaired surrogate") }
                        index += 2
                        let low = try parseHex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw syntax("invalid low surrogate") }
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(code) {
                        throw syntax("unpaired surrogate")
                    }
                    guard let scalar = Unicode.Scalar(code) else { throw syntax("invalid \\u escape") }
                    scalars.append(contentsOf: Array(String(Character(scalar)).utf8))
                default:
                    throw syntax("invalid escape '\\\(Unicode.Scalar(escape))'")
                }
            default:
                guard byte >= 0x20 else { throw syntax("control character in a string") }
                scalars.append(byte)
                index += 1
            }
        }
        throw syntax("unterminated string")
    }

    private mutating func parseHex4() throws(EventValidationError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw syntax("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw syntax("invalid hex digit in \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    private mutating func parseNumber() throws(EventValidationError) -> JSONValue {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw syntax("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw syntax("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard index < bytes.count, isDigit(bytes[index]) else { throw syntax("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        if isInteger, let integer = Int64(text) { return .integer(integer) }
        guard let double = Double(text), double.isFinite else { throw syntax("number out of range") }
        return .double(double)
    }

    private func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
}
