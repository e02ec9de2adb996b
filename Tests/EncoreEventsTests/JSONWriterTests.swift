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
}
