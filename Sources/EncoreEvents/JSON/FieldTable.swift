#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A type whose JSON form is described once, by its ``FieldTable``: the general decoder, the fast
/// path, the encoder and the agreement test against `schemas/` all read the same table. (The
/// journal record and the outcome, written per request, have encoders of their own, tested to
/// write the table's bytes.)
protocol FieldTabled: FieldValue where Rule == Void {
    static var table: FieldTable<Self> { get }
}

/// The fields of one JSON object, in schema order: names, rules and where each lives in `Root`.
final class FieldTable<Root: Sendable>: Sendable {
    /// The value decoding starts from: every required field overwrites its part, and every
    /// optional one is `nil` in it.
    let blank: Root
    let fields: [Field<Root>]
    /// Largest record accepted, in bytes (top-level tables only).
    let byteLimit: Int
    /// Whether the one-pass fast path applies; `false` where two wire fields make one value.
    let fastPath: Bool
    /// Rules that span fields (`error` present exactly when `result` is `failed`), checked last.
    let validate: @Sendable (Root) throws(EventValidationError) -> Void
    /// Bytes to reserve when encoding.
    let capacity: @Sendable (Root) -> Int

    private let names: [[UInt8]]
    private let requiredMask: UInt64
    // The hot closures apart: iterating `fields` would copy (retain and release) whole fields.
    private let scanners: [Field<Root>.Scan]
    private let writers: [Field<Root>.Write]

    init(
        blank: Root, byteLimit: Int = EventLimits.recordBytes, fastPath: Bool = true,
        capacity: @escaping @Sendable (Root) -> Int = { _ in 384 },
        validate: @escaping @Sendable (Root) throws(EventValidationError) -> Void = { _ in },
        _ fields: [Field<Root>]
    ) {
        precondition(fields.count <= 64, "a table holds at most 64 fields")
        self.blank = blank
        self.fields = fields
        self.byteLimit = byteLimit
        self.fastPath = fastPath
        self.validate = validate
        self.capacity = capacity
        names = fields.map { Array($0.schema.name.utf8) }
        scanners = fields.map(\.scan)
        writers = fields.map(\.write)
        requiredMask = fields.indices.reduce(0) { mask, index in fields[index].isRequired ? mask | 1 << index : mask }
    }

    /// The wire form of each field, as `schemas/` should state it.
    var schema: [FieldSchema] { fields.map(\.schema) }

    // MARK: Decoding

    /// Decodes a whole record: the fast path when it answers, the general decoder otherwise.
    func decode(_ bytes: some Collection<UInt8>) throws(EventValidationError) -> Root {
        if fastPath, let decoded = bytes.withContiguousStorageIfAvailable(decodeFast) ?? nil { return decoded }
        return try decodeGeneral(bytes)
    }

    /// The general decoder: any valid JSON, and the errors that name the field at fault.
    func decodeGeneral(_ bytes: some Collection<UInt8>) throws(EventValidationError) -> Root {
        guard bytes.count <= byteLimit else {
            throw EventValidationError(
                .tooLarge, field: "", "record is \(bytes.count) bytes, at most \(byteLimit) allowed")
        }
        return try read(JSONFieldReader(JSONValue.parse(bytes)))
    }

    /// The fast path: the common shape in one pass (ASCII, no escapes, known fields once each,
    /// values of the right type within their limits), or `nil` and the general decoder decides.
    func decodeFast(_ bytes: UnsafeBufferPointer<UInt8>) -> Root? {
        guard fastPath, bytes.count <= byteLimit, isASCII(bytes) else { return nil }
        var scanner = JSONScanner(bytes)
        guard let root = scan(&scanner), scanner.atEnd() else { return nil }
        return root
    }

    func read(_ reader: JSONFieldReader) throws(EventValidationError) -> Root {
        var root = blank
        for field in fields { try field.read(&root, reader) }
        try validate(root)
        return root
    }

    func scan(_ scanner: inout JSONScanner) -> Root? {
        var root = blank
        var seen: UInt64 = 0
        var next = 0
        let complete = withUnsafeMutablePointer(to: &root) { root in
            scanner.object { scanner, name in
                // An unknown field, or a repeated one: the general decoder decides.
                guard let index = field(named: name, expected: next), seen & (1 << index) == 0 else { return false }
                seen |= 1 << index
                next = index + 1
                return scanners[index](root, &scanner)
            }
        }
        guard complete, seen & requiredMask == requiredMask else { return nil }
        for index in fields.indices where seen & (1 << index) == 0 { fields[index].absent?(&root) }
        guard (try? validate(root)) != nil else { return nil }
        return root
    }

    /// The index of the field `name`; records mostly follow table order, so `expected` is tried first.
    private func field(named name: UnsafeBufferPointer<UInt8>, expected: Int) -> Int? {
        func matches(_ index: Int) -> Bool {
            names[index].withUnsafeBufferPointer { candidate in
                candidate.count == name.count
                    && (name.isEmpty || memcmp(candidate.baseAddress!, name.baseAddress!, name.count) == 0)
            }
        }
        if expected < names.count, matches(expected) { return expected }
        return names.indices.first(where: matches)
    }

    // MARK: Encoding

    /// Encodes `root` as compact JSON, fields in table order, absent optionals omitted.
    func encode(_ root: Root) -> [UInt8] {
        var writer = JSONWriter(capacity: capacity(root))
        write(root, to: &writer)
        return writer.bytes
    }

    func write(_ root: Root, to writer: inout JSONWriter) {
        withUnsafePointer(to: root) { root in write(at: root, to: &writer) }
    }

    /// Writes the value at `root` in place (an array's items are not copied out first).
    func write(at root: UnsafePointer<Root>, to writer: inout JSONWriter) {
        writer.beginObject()
        // Called in place: a closure copied out of the array is retained and released per field.
        writers.withUnsafeBufferPointer { writers in
            for index in writers.indices { writers[index](root, &writer) }
        }
        writer.endObject()
    }
}

/// One field of a ``FieldTable``: its wire name and form, and how it reads and writes `Root`.
struct Field<Root>: Sendable {
    let schema: FieldSchema
    var isRequired: Bool { schema.isRequired }
    let read: @Sendable (inout Root, JSONFieldReader) throws(EventValidationError) -> Void
    /// The fast path and the encoder reach the value in place (``FieldLocation``).
    typealias Scan = @Sendable (UnsafeMutablePointer<Root>, inout JSONScanner) -> Bool
    typealias Write = @Sendable (UnsafePointer<Root>, inout JSONWriter) -> Void
    let scan: Scan
    /// Sets the value a record that leaves the field out means, unless the blank holds it (`nil`).
    let absent: (@Sendable (inout Root) -> Void)?
    let write: Write

    /// A field every record has, or, with `whenAbsent`, one that may be left out and then reads as
    /// that value; `omittedWhen` leaves it out of records where it holds that value.
    static func field<Value: FieldValue>(
        _ name: StaticString, _ path: WritableKeyPath<Root, Value> & Sendable, _ rule: Value.Rule = Value.defaultRule,
        whenAbsent: Value? = nil, omittedWhen: Value? = nil
    ) -> Field {
        let key = name.description
        let location = FieldLocation(path)
        var absent: (@Sendable (inout Root) -> Void)? = nil
        if let whenAbsent { absent = { root in root[keyPath: path] = whenAbsent } }
        return Field(
            schema: FieldSchema(name: key, isRequired: whenAbsent == nil, shape: Value.shape(rule)),
            read: { (root, reader) throws(EventValidationError) in
                if let value = try Value.read(key, from: reader, rule) {
                    root[keyPath: path] = value
                } else if let whenAbsent {
                    root[keyPath: path] = whenAbsent
                } else {
                    throw reader.missing(key)
                }
            },
            scan: { root, scanner in
                guard let value = Value.scan(&scanner, rule) else { return false }
                location.set(root, value)
                return true
            },
            absent: absent,
            write: { root, writer in
                location.borrow(root) { value in
                    if let omittedWhen, value == omittedWhen { return }
                    writer.key(name)
                    value.write(to: &writer, rule)
                }
            })
    }

    /// A field records may leave out (or hold `null` in); `nil` is never written.
    static func field<Value: FieldValue>(
        _ name: StaticString, _ path: WritableKeyPath<Root, Value?> & Sendable, _ rule: Value.Rule = Value.defaultRule
    ) -> Field {
        let key = name.description
        let location = FieldLocation(path)
        return Field(
            schema: FieldSchema(name: key, isRequired: false, shape: Value.shape(rule)),
            read: { (root, reader) throws(EventValidationError) in
                root[keyPath: path] = try Value.read(key, from: reader, rule)
            },
            scan: { root, scanner in
                guard let value = Value.scan(&scanner, rule) else { return false }
                location.set(root, value)
                return true
            },
            absent: nil,
            write: { root, writer in
                location.borrow(root) { value in
                    guard value != nil else { return }
                    writer.key(name)
                    value!.write(to: &writer, rule)
                }
            })
    }
}

/// Where a field's value lives in `Root`. A stored property is read and written in place at its
/// offset, as `MemoryLayout.offset(of:)` documents; applying a key path costs a runtime call and
/// metadata lookups per field, several times the field's own decoding. A computed property goes
/// through its key path.
struct FieldLocation<Root, Value>: Sendable {
    private let path: WritableKeyPath<Root, Value> & Sendable
    private let offset: Int?

    init(_ path: WritableKeyPath<Root, Value> & Sendable) {
        self.path = path
        offset = MemoryLayout<Root>.offset(of: path)
    }

    /// Hands the value to `body` without copying it (a copy retains and releases it).
    func borrow(_ root: UnsafePointer<Root>, _ body: (borrowing Value) -> Void) {
        guard let offset else { return body(root.pointee[keyPath: path]) }
        body(UnsafeRawPointer(root).advanced(by: offset).assumingMemoryBound(to: Value.self).pointee)
    }

    func set(_ root: UnsafeMutablePointer<Root>, _ value: Value) {
        guard let offset else {
            root.pointee[keyPath: path] = value
            return
        }
        UnsafeMutableRawPointer(root).advanced(by: offset).assumingMemoryBound(to: Value.self).pointee = value
    }
}

/// A field's wire form as JSON Schema states it; the agreement test compares it with `schemas/`.
struct FieldSchema: Sendable, Equatable {
    let name: String
    /// In the schema's `required` list (a rule across fields may require more).
    let isRequired: Bool
    let shape: FieldShape
}

indirect enum FieldShape: Sendable, Equatable {
    /// Lengths count code points; `maxLength` `nil` is unbounded.
    case string(minLength: Int, maxLength: Int?, pattern: String?)
    case integer(minimum: Int64)
    case number(minimum: Double, maximum: Double)
    case boolean
    case enumeration([String])
    case object([FieldSchema])
    case array(maxItems: Int, items: [FieldSchema])
    case stringMap(maxProperties: Int, maxKeyLength: Int, maxValueLength: Int)
}
