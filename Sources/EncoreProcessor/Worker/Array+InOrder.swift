extension Array {
    /// Empties the array, handing `body` each element in order, moved out: a `for` loop, an index
    /// or a case pattern on an element copies it, with every string and array it holds. (Reversed
    /// in place through its buffer, whose swaps move; `reverse()` copies each element it swaps.
    /// `removeLast()`, not `popLast()`: binding the popped optional copied it.)
    mutating func removeAllInOrder(_ body: (consuming Element) -> Void) {
        reverseMovingElements()
        while !isEmpty { body(removeLast()) }
    }

    /// Reverses the array through its buffer, whose swaps move the elements (`reverse()` copies
    /// each element it swaps).
    mutating func reverseMovingElements() {
        withUnsafeMutableBufferPointer { $0.reverse() }
    }
}
