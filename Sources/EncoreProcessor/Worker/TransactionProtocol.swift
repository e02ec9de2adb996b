/// Exactly-once's protocol: what a worker produces goes into one Kafka transaction at a time,
/// committed with the consumer offsets of the records whose outputs it holds. A pure state
/// machine: the loop tells it what happened (outputs handed to the producer and answered, intents
/// written, hand-overs, the commit's end) and does what it answers (commit now; start the calls
/// whose intents committed; hand these partitions over).
///
/// - A call starts only once the transaction holding its intent committed, so an aborted
///   transaction can only erase intents of calls never made.
/// - A commit is due at the commit interval, when an intent waits for it, when a hand-over needs
///   its offsets, or at the end of a drain; it starts once every output handed over is answered,
///   and new outputs wait for the next transaction meanwhile.
/// - A failed delivery or commit stops the processor (the loop's part): the restart redoes what
///   the transaction held.
struct TransactionProtocol<Item, HandOver> {
    enum Phase: Equatable {
        /// Outputs go into the transaction.
        case open
        /// A commit is due: it starts once every output handed over is answered; new outputs wait.
        case draining
        /// The commit is in flight.
        case committing
        /// The final transaction committed, or the loop ended: nothing more is produced.
        case closed
    }

    private(set) var phase = Phase.open
    /// Outputs handed to the producer in this transaction and not yet answered.
    private(set) var unanswered = 0
    /// Whether anything was produced in this transaction.
    private(set) var produced = false
    /// Items whose intents this transaction holds: their calls start when it commits.
    private var intents: [Item] = []
    private var committing: [Item] = []
    /// Revocations whose offsets go into the next commit; handed over once it committed.
    private var handOvers: [HandOver] = []
    private var handingOver: [HandOver] = []

    /// Whether outputs may be handed to the producer now.
    var acceptsOutputs: Bool { phase == .open }
    var isClosed: Bool { phase == .closed }

    mutating func handed(_ count: Int) {
        unanswered += count
        produced = true
    }

    mutating func answered(_ count: Int) { unanswered -= count }

    /// An intent is in this transaction: its call waits for the commit.
    mutating func hold(intent item: Item) { intents.append(item) }

    /// A revocation's offsets go into the next commit.
    mutating func hold(handOver: HandOver) { handOvers.append(handOver) }

    /// Whether a commit is due: `isDue` (the commit interval passed), an intent or a hand-over
    /// waiting, or `force` (the end of a drain); and whether there is anything to commit
    /// (`offsetsChanged`: a partition's offset moved since the last commit).
    mutating func tick(isDue: Bool, offsetsChanged: Bool, force: Bool = false) {
        guard phase == .open else { return }
        let due = isDue || !intents.isEmpty || !handOvers.isEmpty || force
        guard due, produced || offsetsChanged || !handOvers.isEmpty || force else { return }
        phase = .draining
    }

    /// The commit to start now that every output of the transaction is answered: the hand-overs
    /// whose offsets it carries. `nil`: no commit is due, or outputs are still unanswered.
    mutating func startCommit() -> [HandOver]? {
        guard phase == .draining, unanswered == 0 else { return nil }
        phase = .committing
        handingOver = handOvers
        handOvers = []
        committing = intents
        intents = []
        return handingOver
    }

    /// The commit ended, committed or failed: the items whose intents it held and the hand-overs it
    /// carried. The next transaction is open (unless closed meanwhile).
    mutating func commitEnded() -> (items: [Item], handOvers: [HandOver]) {
        let ended = (items: committing, handOvers: handingOver)
        committing = []
        handingOver = []
        produced = false
        if phase != .closed { phase = .open }
        return ended
    }

    /// Nothing more is produced: the final transaction committed, or the loop ended.
    mutating func close() { phase = .closed }
}
