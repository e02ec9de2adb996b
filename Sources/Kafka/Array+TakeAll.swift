extension Array {
    /// Hands the elements over and keeps room for as many again, for a buffer refilled and handed
    /// over in rounds. (`let all = buffer; buffer.removeAll(keepingCapacity: true)` allocates a
    /// buffer of the whole high-water capacity each round, since the old one is shared with the copy
    /// handed over.)
    package mutating func takeAll() -> [Element] {
        var taken: [Element] = []
        swap(&taken, &self)
        reserveCapacity(taken.count)
        return taken
    }
}
