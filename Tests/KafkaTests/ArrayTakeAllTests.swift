import Testing

@testable import Kafka

/// `takeAll()`: a buffer handed over in rounds, without a new buffer of its high-water capacity
/// each round.
@Suite("Array.takeAll: handing a refilled buffer over")
struct ArrayTakeAllTests {
    @Test("hands over the elements in their buffer, and leaves an empty one with room for as many")
    func handsOverTheBuffer() {
        var buffer: [Int] = []
        buffer.reserveCapacity(10_000)
        buffer.append(contentsOf: 0..<3)
        let before = buffer.withUnsafeBufferPointer { $0.baseAddress }
        let taken = buffer.takeAll()
        #expect(taken == [0, 1, 2])
        #expect(taken.withUnsafeBufferPointer { $0.baseAddress } == before, "the elements are not copied")
        #expect(buffer.isEmpty)
        // Room for the last round's count, not the 10,000 the buffer once reserved.
        #expect(buffer.capacity >= 3 && buffer.capacity < 100)
        buffer.append(7)
        #expect(taken == [0, 1, 2] && buffer == [7])
        #expect(buffer.takeAll() == [7] && buffer.isEmpty)
    }
}
