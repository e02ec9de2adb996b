import EncoreEvents
import Testing

@Suite("JSON writer")
struct JSONWriterTests {
    @Test(
        "integers are written in full, sign included, and read back equal",
        arguments: [Int64(0), 7, -7, 10, -1000, 1_733_050_000_123, .max, .min])
    func integers(_ value: Int64) throws {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("n", value)
        writer.field("t", true)
        writer.field("f", false)
        writer.endObject()
        #expect(String(decoding: writer.bytes, as: UTF8.self) == "{\"n\":\(value),\"t\":true,\"f\":false}")
        #expect(
            try JSONValue.parse(writer.bytes) == .object(["n": .integer(value), "t": .bool(true), "f": .bool(false)]))
    }

    @Test("a reused buffer is written into where it lies, emptied first: no new storage per record")
    func reusedBuffer() {
        let buffer = [UInt8](repeating: UInt8(ascii: "x"), count: 100)
        let storage = buffer.withUnsafeBufferPointer { $0.baseAddress }
        var writer = JSONWriter(reusing: consume buffer)
        writer.beginObject()
        writer.field("n", Int64(1))
        writer.endObject()
        let bytes = writer.takeBytes()
        #expect(String(decoding: bytes, as: UTF8.self) == "{\"n\":1}")
        #expect(bytes.withUnsafeBufferPointer { $0.baseAddress } == storage)
        #expect(bytes.capacity >= 100)
    }
}
