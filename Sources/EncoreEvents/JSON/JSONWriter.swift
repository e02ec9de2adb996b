/// Writes compact JSON into a byte buffer, fields in the order they are written.
public struct JSONWriter: Sendable {
    public private(set) var bytes: [UInt8] = []
    private var needsComma = false

    public init(capacity: Int = 384) {
        bytes.reserveCapacity(capacity)
    }

    /// A writer into `buffer`, emptied first with its capacity kept: a buffer reused record after
    /// record allocates nothing once it has grown to their size. ``takeBytes()`` hands it back.
    public init(reusing buffer: consuming [UInt8]) {
        // Emptied before it is stored: once stored, the parameter is a second reference to the
        // array, and `removeAll` finds it shared and allocates a new one instead of reusing it.
        buffer.removeAll(keepingCapacity: true)
        bytes = buffer
    }

    /// The bytes written, moved out (the writer is left empty).
    public mutating func takeBytes() -> [UInt8] {
        needsComma = false
        var taken: [UInt8] = []
        swap(&taken, &bytes)
        return taken
    }

    public mutating func beginObject() {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    public mutating func beginArray() {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// Writes values already encoded, comma-separated (`bytes` may be empty), as the next values
    /// of the array being written.
    mutating func encodedValues(_ bytes: [UInt8]) {
        guard !bytes.isEmpty else { return }
        separate()
        bytes.withUnsafeBufferPointer { self.bytes.append(contentsOf: $0) }
        needsComma = true
    }

    /// Writes a field name; the next value written is its value.
    public mutating func key(_ name: StaticString) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Writes a field name that is not known at compile time (map keys).
    public mutating func key(dynamic name: String) {
        string(name)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    public mutating func string(_ value: String) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        // Most values need no escaping: copy them whole.
        let copied =
            value.utf8.withContiguousStorageIfAvailable { utf8 in
                guard !utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") })
                else { return false }
                bytes.append(contentsOf: utf8)
                return true
            } ?? false
        if copied {
            bytes.append(UInt8(ascii: "\""))
            needsComma = true
            return
        }
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x0A: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0..<0x20:
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                bytes.append(contentsOf: [
                    UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex[Int(byte >> 4)],
                    hex[Int(byte & 0xF)],
                ])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    public mutating func integer(_ value: Int64) {
        separate()
        Self.appendDecimal(value, to: &bytes)
        needsComma = true
    }

    /// Appends `value`'s decimal digits (and sign) to `bytes`, with no String between.
    public static func appendDecimal(_ value: Int64, to bytes: inout [UInt8]) {
        guard value != 0 else {
            bytes.append(UInt8(ascii: "0"))
            return
        }
        var magnitude = value.magnitude
        var digits:
            (
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8
            ) =
                (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        // Written from the end of the buffer backwards, then appended in one copy.
        var start = 20
        withUnsafeMutableBytes(of: &digits) { buffer in
            while magnitude > 0 {
                start -= 1
                buffer[start] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            }
            if value < 0 {
                start -= 1
                buffer[start] = UInt8(ascii: "-")
            }
            bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[start...]))
        }
    }

    public mutating func number(_ value: Double) {
        if value.rounded() == value, abs(value) < 1e15 {
            integer(Int64(value))
        } else {
            separate()
            bytes.append(contentsOf: Array("\(value)".utf8))
            needsComma = true
        }
    }

    /// Writes `null` (a value the reader must see as absent, not omitted).
    public mutating func null() {
        separate()
        bytes.append(contentsOf: [UInt8(ascii: "n"), UInt8(ascii: "u"), UInt8(ascii: "l"), UInt8(ascii: "l")])
        needsComma = true
    }

    public mutating func bool(_ value: Bool) {
        separate()
        let literal: StaticString = value ? "true" : "false"
        bytes.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
        needsComma = true
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
    }

    // Optional conveniences: absent values are omitted, never written as null.

    public mutating func field(_ name: StaticString, _ value: String) {
        key(name)
        string(value)
    }

    public mutating func field(_ name: StaticString, _ value: String?) {
        if let value { field(name, value) }
    }

    public mutating func field(_ name: StaticString, _ value: Int64) {
        key(name)
        integer(value)
    }

    public mutating func field(_ name: StaticString, _ value: Int64?) {
        if let value { field(name, value) }
    }

    public mutating func field(_ name: StaticString, _ value: Int) {
        field(name, Int64(value))
    }

    public mutating func field(_ name: StaticString, _ value: Double) {
        key(name)
        number(value)
    }

    /// Writes `name` as an array of strings.
    public mutating func field(_ name: StaticString, _ values: [String]) {
        key(name)
        beginArray()
        for value in values { string(value) }
        endArray()
    }

    public mutating func field(_ name: StaticString, _ value: Bool) {
        key(name)
        bool(value)
    }

    public mutating func field<E: RawRepresentable<String>>(_ name: StaticString, _ value: E) {
        field(name, value.rawValue)
    }

    public mutating func field<E: RawRepresentable<String>>(_ name: StaticString, _ value: E?) {
        if let value { field(name, value.rawValue) }
    }

    /// Writes `name` as an array with one object per item, its fields written by `body`.
    public mutating func objects<Item>(
        _ name: StaticString, _ items: some Sequence<Item>, _ body: (inout JSONWriter, Item) -> Void
    ) {
        key(name)
        beginArray()
        for item in items {
            beginObject()
            body(&self, item)
            endObject()
        }
        endArray()
    }
}
