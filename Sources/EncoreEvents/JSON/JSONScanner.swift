/// Reads the common shape of JSON in one pass over its bytes, without building a tree: the tokens
/// of the fast path of ``FieldTable``. Every read returns `nil` on anything unusual (an escape, a
/// `null`, a float where an integer is expected), and the general decoder decides.
struct JSONScanner {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    /// Whether all of the bytes were read (whitespace after the value included).
    mutating func atEnd() -> Bool {
        skipWhitespace()
        return index == bytes.count
    }

    /// Reads `{`, then each `"name":` with `body` reading its value, then `}`.
    /// `body` returns `false` to decline the whole record.
    mutating func object(_ body: (inout JSONScanner, UnsafeBufferPointer<UInt8>) -> Bool) -> Bool {
        skipWhitespace()
        guard consume(UInt8(ascii: "{")) else { return false }
        skipWhitespace()
        if consume(UInt8(ascii: "}")) { return true }
        repeat {
            skipWhitespace()
            guard let name = rawString() else { return false }
            skipWhitespace()
            guard consume(UInt8(ascii: ":")) else { return false }
            skipWhitespace()
            guard body(&self, name) else { return false }
            skipWhitespace()
        } while consume(UInt8(ascii: ","))
        return consume(UInt8(ascii: "}"))
    }

    /// Reads `[`, then each item with `body`, then `]`.
    mutating func array(_ body: (inout JSONScanner) -> Bool) -> Bool {
        skipWhitespace()
        guard consume(UInt8(ascii: "[")) else { return false }
        skipWhitespace()
        if consume(UInt8(ascii: "]")) { return true }
        repeat {
            skipWhitespace()
            guard body(&self) else { return false }
            skipWhitespace()
        } while consume(UInt8(ascii: ","))
        return consume(UInt8(ascii: "]"))
    }

    /// The bytes of a string without escapes or control characters.
    mutating func rawString() -> UnsafeBufferPointer<UInt8>? {
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

    /// A non-negative integer written with digits only (at most 18 of them).
    mutating func integer() -> Int64? {
        let start = index
        var value: Int64 = 0
        while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
            // Eighteen digits cannot overflow; longer numbers are left to the general decoder.
            guard index - start < 18 else { return nil }
            value = value * 10 + Int64(bytes[index] - UInt8(ascii: "0"))
            index += 1
        }
        let digits = index - start
        guard digits > 0, digits == 1 || bytes[start] != UInt8(ascii: "0"), !atNumberContinuation() else { return nil }
        return value
    }

    /// A plain decimal number (digits, an optional fraction; no sign, no exponent).
    mutating func number() -> Double? {
        let start = index
        var dots = 0
        while index < bytes.count, isDigit(bytes[index]) || bytes[index] == UInt8(ascii: ".") {
            if bytes[index] == UInt8(ascii: ".") { dots += 1 }
            index += 1
        }
        let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
        guard let first = text.first, let last = text.last, dots <= 1, isDigit(first), isDigit(last),
            !(first == UInt8(ascii: "0") && text.count > 1 && text[1] != UInt8(ascii: ".")), !atNumberContinuation()
        else { return nil }
        return Double(String(decoding: text, as: UTF8.self))
    }

    /// `null`, read if it is next.
    mutating func null() -> Bool { skipWhitespace() ? literal("null") : false }

    /// Skips any one JSON value (escapes, signs and exponents, nesting at most `depth` deep);
    /// `false` on anything that is not JSON.
    mutating func skipValue(depth: Int = 32) -> Bool {
        skipWhitespace()
        guard index < bytes.count, depth > 0 else { return false }
        switch bytes[index] {
        case UInt8(ascii: "{"): return object { scanner, _ in scanner.skipValue(depth: depth - 1) }
        case UInt8(ascii: "["): return array { $0.skipValue(depth: depth - 1) }
        case UInt8(ascii: "\""): return skipString()
        case UInt8(ascii: "t"): return literal("true")
        case UInt8(ascii: "f"): return literal("false")
        case UInt8(ascii: "n"): return literal("null")
        default:
            let start = index
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."),
                    UInt8(ascii: "e"), UInt8(ascii: "E"):
                    index += 1
                default:
                    return index > start
                }
            }
            return index > start
        }
    }

    /// Skips a string, escapes included.
    private mutating func skipString() -> Bool {
        guard consume(UInt8(ascii: "\"")) else { return false }
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            if byte == UInt8(ascii: "\"") { return true }
            if byte == UInt8(ascii: "\\") { index += 1 }
        }
        return false
    }

    /// `true` or `false`.
    mutating func bool() -> Bool? {
        if literal("true") { return true }
        if literal("false") { return false }
        return nil
    }

    private mutating func literal(_ word: StaticString) -> Bool {
        let length = word.utf8CodeUnitCount
        guard index + length <= bytes.count,
            UnsafeBufferPointer(rebasing: bytes[index..<index + length]).elementsEqual(
                UnsafeBufferPointer(start: word.utf8Start, count: length))
        else { return false }
        index += length
        return true
    }

    private func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

    /// A sign, fraction or exponent follows: not a number of the simple kind.
    private func atNumberContinuation() -> Bool {
        guard index < bytes.count else { return false }
        let byte = bytes[index]
        return byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
            || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "+")
    }

    private mutating func consume(_ byte: UInt8) -> Bool {
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// Skips whitespace; `true` unless at the end.
    @discardableResult
    private mutating func skipWhitespace() -> Bool {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return true
            }
        }
        return false
    }
}
