/// Headers written into one reused byte buffer: a record's headers are appended, produced, and
/// removed again, and once the buffer has grown nothing is allocated (a `[KafkaHeader]` costs an
/// array, and a retain and release of each key and value, per record).
public struct KafkaHeaderBuffer: Sendable {
    private struct Entry: Sendable {
        var keyStart: Int
        var keyCount: Int
        var valueStart: Int
        /// -1: the header has no value (null, not empty).
        var valueCount: Int
    }

    private var storage: [UInt8] = []
    private var entries: [Entry] = []

    /// An empty buffer.
    public init() {}

    /// A buffer holding `headers`, in order.
    public init(_ headers: [KafkaHeader]) {
        for header in headers { append(header) }
    }

    /// How many headers it holds.
    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }

    /// The bytes it holds room for (keys and values together).
    public var capacity: Int { storage.capacity }

    /// Empties the buffer, keeping its capacity.
    public mutating func removeAll() {
        storage.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: true)
    }

    public mutating func append(_ header: KafkaHeader) {
        if let value = header.value {
            value.withUnsafeBytes { append(key: header.key, value: $0) }
        } else {
            append(key: header.key, value: nil)
        }
    }

    /// Appends a header whose value is `value` (`nil`: no value).
    public mutating func append(key: String, value: UnsafeRawBufferPointer?) {
        append(key: key, isNull: value == nil) { if let value { $0.append(contentsOf: value) } }
    }

    /// Appends a header of key bytes `key` (UTF-8) and value `value` (`nil`: no value), both copied.
    mutating func append(keyBytes key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer?) {
        append(key: key, isNull: value == nil) { if let value { $0.append(contentsOf: value) } }
    }

    /// Makes room for `headers` more headers of `bytes` key and value bytes in all.
    mutating func reserve(headers: Int, bytes: Int) {
        entries.reserveCapacity(entries.count + headers)
        storage.reserveCapacity(storage.count + bytes)
    }

    /// The value of the first header whose key is `key`, decoded as UTF-8 (`nil`: no such header,
    /// no value, or not valid UTF-8).
    public func firstValue(_ key: String) -> String? {
        var found: String?? = nil
        var key = key
        key.withUTF8 { wanted in
            forEach { candidate, value in
                guard found == nil, candidate.elementsEqual(UnsafeRawBufferPointer(wanted)) else { return }
                found = .some(value.flatMap { String(validating: $0, as: UTF8.self) })
            }
        }
        return found ?? nil
    }

    /// Appends a header whose value `write` appends to the bytes it is handed (written in place:
    /// no array of its own).
    public mutating func append(key: String, writing write: (inout [UInt8]) -> Void) {
        append(key: key, isNull: false, write)
    }

    /// Appends header `index` of `other`.
    public mutating func append(_ other: borrowing KafkaHeaderBuffer, at index: Int) {
        let entry = other.entries[index]
        let keyStart = storage.count
        // (Through a pointer: a slice of the other's storage would retain it.)
        other.storage.withUnsafeBufferPointer { bytes in
            storage.append(
                contentsOf: UnsafeBufferPointer(rebasing: bytes[entry.keyStart..<entry.keyStart + entry.keyCount]))
            if entry.valueCount > 0 {
                storage.append(
                    contentsOf: UnsafeBufferPointer(
                        rebasing: bytes[entry.valueStart..<entry.valueStart + entry.valueCount]))
            }
        }
        let valueStart = keyStart + entry.keyCount
        entries.append(
            Entry(keyStart: keyStart, keyCount: entry.keyCount, valueStart: valueStart, valueCount: entry.valueCount))
    }

    /// Hands `body` each header's key and value (`nil`: no value), in order, borrowed from the buffer.
    public func forEach(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer?) -> Void) {
        storage.withUnsafeBytes { bytes in
            for entry in entries {
                let key = UnsafeRawBufferPointer(rebasing: bytes[entry.keyStart..<entry.keyStart + entry.keyCount])
                let value =
                    entry.valueCount < 0
                    ? nil
                    : UnsafeRawBufferPointer(rebasing: bytes[entry.valueStart..<entry.valueStart + entry.valueCount])
                body(key, value)
            }
        }
    }

    /// The headers as values, in order.
    public var values: [KafkaHeader] {
        var headers: [KafkaHeader] = []
        headers.reserveCapacity(entries.count)
        forEach { key, value in
            headers.append(KafkaHeader(key: String(decoding: key, as: UTF8.self), value: value.map { Array($0) }))
        }
        return headers
    }

    private mutating func append(key: String, isNull: Bool, _ write: (inout [UInt8]) -> Void) {
        var key = key
        key.withUTF8 { append(key: UnsafeRawBufferPointer($0), isNull: isNull, write) }
    }

    private mutating func append(key: UnsafeRawBufferPointer, isNull: Bool, _ write: (inout [UInt8]) -> Void) {
        let keyStart = storage.count
        storage.append(contentsOf: key)
        let valueStart = storage.count
        write(&storage)
        entries.append(
            Entry(
                keyStart: keyStart, keyCount: valueStart - keyStart, valueStart: valueStart,
                valueCount: isNull ? -1 : storage.count - valueStart))
    }
}

/// A record to produce, encoded into buffers that are reused record after record: the producer
/// copies what it is handed (``KafkaProducer/produce(_:token:)``), so one buffer serves every
/// record of a worker, and encoding a record allocates nothing once the buffers have grown to the
/// records' size.
public struct KafkaRecordBuffer: Sendable {
    /// Buffers grown beyond this many bytes by one large record (a dead letter of a large record)
    /// are let go after it (``shrink()``), rather than held for the rest of the process.
    public static let retainedCapacity = 64 * 1024

    /// The record's topic.
    public var topic = ""
    /// `nil` lets the partitioner choose by key.
    public var partition: Int32? = nil
    /// The key's bytes; meaningful only when `hasKey` (a record with an empty key is not one without).
    public var key: [UInt8] = []
    public var hasKey = false
    /// The value's bytes.
    public var value: [UInt8] = []
    /// The record's headers, in order.
    public var headers = KafkaHeaderBuffer()

    /// An empty buffer.
    public init() {}

    /// Starts the next record: its topic and partition, everything else emptied (capacity kept).
    public mutating func begin(topic: String, partition: Int32?) {
        self.topic = topic
        self.partition = partition
        key.removeAll(keepingCapacity: true)
        hasKey = false
        value.removeAll(keepingCapacity: true)
        headers.removeAll()
    }

    /// Starts the record with `record`'s contents (copied into the buffers).
    public mutating func begin(with record: borrowing KafkaProducerRecord) {
        begin(topic: record.topic, partition: record.partition)
        if let recordKey = record.key {
            hasKey = true
            key.append(contentsOf: recordKey)
        }
        value.append(contentsOf: record.value)
        for header in record.headers { headers.append(header) }
    }

    /// The value, moved out (to be written into and put back: ``value`` then keeps its capacity).
    public mutating func takeValue() -> [UInt8] {
        var taken: [UInt8] = []
        swap(&taken, &value)
        return taken
    }

    /// Lets go of buffers grown beyond ``retainedCapacity``: the next record starts them anew.
    public mutating func shrink() {
        if key.capacity > Self.retainedCapacity { key = [] }
        if value.capacity > Self.retainedCapacity { value = [] }
        if headers.capacity > Self.retainedCapacity { headers = KafkaHeaderBuffer() }
    }

    /// The record as a value (for a failure report, or a producer that keeps what it is handed).
    public var record: KafkaProducerRecord {
        KafkaProducerRecord(
            topic: topic, partition: partition, key: hasKey ? key : nil, value: value, headers: headers.values)
    }
}
