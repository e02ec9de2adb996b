import EncoreEvents

/// What one mutation of a user's ledger state gives: the change events to publish (in order,
/// possibly none), the user's state (the identity alone in the processor's own updates of the
/// journal alone, ``holdsState``), whether the state record must be written (its grants, sources
/// or access changed), and the request journal's record, if the journal changed.
public struct LedgerUpdate: Sendable, Equatable {
    public var changes: [EntitlementChangeEvent]
    /// (Set within the module only, without changing its user: `key` is its key.)
    public internal(set) var state: EntitlementStateRecord
    /// The partition of the user's requests, where the state is written.
    public var partition: Int32
    /// The user's key (`state.key`), built once.
    public let key: String
    /// Whether the user's state record is written (journal v2: only when the state changed).
    public var writesState: Bool
    /// The journal entry this update writes, a small record of its own.
    public var journal: JournalRecord?
    /// Whether `state` is the user's whole state. The processor's own updates of the journal alone
    /// (`writesState` false) carry the user's identity only: its output tracker writes a state only
    /// from an update that changed it, and copying the whole state into the two journal updates of
    /// every request took about 20 of the loop's 642 reference-count operations a request
    /// (`scripts/refcounts.sh`, a user with one grant; more with more grants). The public methods'
    /// updates always hold it.
    let holdsState: Bool

    public init(
        changes: [EntitlementChangeEvent], state: EntitlementStateRecord, partition: Int32, writesState: Bool = true,
        journal: JournalRecord? = nil
    ) {
        self.init(
            changes: changes, state: state, partition: partition, key: state.key, writesState: writesState,
            journal: journal)
    }

    /// `key` must be `state.key`.
    init(
        changes: [EntitlementChangeEvent], state: EntitlementStateRecord, partition: Int32, key: String,
        writesState: Bool = true, journal: JournalRecord? = nil, holdsState: Bool = true
    ) {
        self.changes = changes
        self.state = state
        self.partition = partition
        self.key = key
        self.writesState = writesState
        self.journal = journal
        self.holdsState = holdsState
    }
}
