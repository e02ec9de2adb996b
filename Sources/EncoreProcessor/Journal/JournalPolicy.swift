import EncoreEvents

/// How long and how many of a user's requests the journal remembers: a re-sent request whose
/// result is still in the journal is not called again.
public struct JournalPolicy: Sendable, Hashable {
    /// Entries untouched for longer are dropped.
    public var retentionMs: Int64
    /// Most entries per user; past it, the oldest results go. Open intents stay (a request in
    /// flight or in doubt must be found by a restart), until the retention drops them.
    public var perUserCap: Int

    /// (``ProcessorConfiguration/validate()`` checks the bounds: at least a minute, 1 to 1,000.)
    public init(retentionMs: Int64 = 7 * 86_400_000, perUserCap: Int = 100) {
        self.retentionMs = retentionMs
        self.perUserCap = perUserCap
    }

    /// Drops entries past the retention at `nowMs`, then the oldest beyond the cap; whether it
    /// dropped any.
    @discardableResult
    func prune(_ journal: inout RequestJournal, nowMs: Int64) -> Bool {
        journal.prune(untouchedBefore: nowMs - retentionMs, cap: perUserCap)
    }
}
