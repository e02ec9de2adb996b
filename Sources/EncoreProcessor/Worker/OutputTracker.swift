import EncoreEvents
import Kafka

/// The outputs of one loop between being sent and being acknowledged: which record each belongs
/// to (a record is done when all of its outputs are), and the order of a user's outputs.
///
/// Outputs are handed out as tokens (``takeUnsent()``) and come back as ``KafkaDelivery``s. A
/// retriable failure is produced again after `redeliveryDelay`, still ahead of the user's later
/// outputs: outcomes by the user's lane (held until its outputs are acknowledged), change events
/// here (one of a user's in flight at a time), changelog records by the update order (one write of
/// a user's in flight at a time; in a write, the state record alone first, then the journal
/// records, whose order does not matter: each is another request's, under its own key).
/// Any other failure is fatal: the record never finishes, so its offset is never committed. A state
/// machine with no I/O; `Item` is what the loop keeps with a record (its work item). Its pending
/// updates are objects: a copy of a tracker shares them, so it is never copied.
struct OutputTracker<Item> {
    private struct Slot {
        var ref: RecordRef?
        var output: Output
        /// The ledger update whose changelog record waits for this output.
        var update: Int? = nil
        /// The record being produced again after a failed delivery.
        var redelivery: KafkaProducerRecord? = nil
    }

    private struct PendingRecord {
        var outputs = 0
        var item: Item?
    }

    /// A ledger update whose changelog record waits for the outputs sent with it (change events,
    /// the outcome and dead letter whose result it records): the state is written only after
    /// them, so a restored state never claims a change or a result that was not published. A class:
    /// looked up several times per output, a value (a whole state record) would be copied each time.
    private final class PendingUpdate {
        let ref: RecordRef?
        /// The user (`state.key`, hashed once: the tracker looks the user up several times per output).
        let key: UserLane
        /// Its state, whether the state record is written (the state changed), and its journal
        /// record (its change events, already sent, are taken out). When the update is written, its
        /// journal record is moved into the write, and so is its state when it is the write's last
        /// update that changed the state.
        private(set) var contents: LedgerUpdate
        var writesState: Bool { contents.writesState }
        /// Whether its `state` is the user's whole state (``LedgerUpdate/holdsState``).
        var holdsState: Bool { contents.holdsState }
        var partition: Int32 { contents.partition }
        var unacknowledgedOutputs: Int
        var isWritten = false
        /// Changelog records of this write not yet acknowledged (the last update of a write).
        var unwrittenRecords = 0
        /// The write's journal records, produced once its state record is acknowledged.
        var deferredJournal: [JournalRecord] = []
        /// The item whose call waits for this record (an intent): reported when it is acknowledged.
        var intent: Item?
        /// The item whose result this is, reported by ``Event/resultReady(_:)`` once the outputs
        /// sent with it are acknowledged.
        var result: Item?
        /// How many of the user's oldest updates (this one the last) this update's changelog record
        /// is: written together, the latest state holding the earlier ones.
        var covering = 0

        /// The journal record, moved out to be written (a copy would retain each of its strings).
        func takeJournal() -> JournalRecord? { contents.journal.take() }

        /// The state, moved out to be written.
        func takeState() -> EntitlementStateRecord {
            var state = EntitlementStateRecord(appID: "", appUserID: "")
            swap(&state, &contents.state)
            return state
        }

        init(
            ref: RecordRef?, key: UserLane, update: consuming LedgerUpdate, unacknowledgedOutputs: Int, intent: Item?,
            result: Item?
        ) {
            self.ref = ref
            self.key = key
            self.contents = update
            self.unacknowledgedOutputs = unacknowledgedOutputs
            self.intent = intent
            self.result = result
        }
    }

    enum Event {
        /// The broker acknowledged an output.
        case acknowledged(Output)
        /// Every output of the record is acknowledged.
        case recordDone(RecordRef, Item?)
        /// The changelog record holding the item's intent is acknowledged: its call may start.
        case intentWritten(Item)
        /// The outputs of the item's result (outcome, dead letter, change events) are acknowledged;
        /// its changelog record is not written yet. Anything the user publishes now is written with
        /// or after it.
        case resultReady(Item)
        /// A delivery failed and will be produced again.
        case redelivering(topic: String, KafkaError)
        /// A delivery failed for good: the processor must stop.
        case fatal(topic: String, KafkaError)
    }

    let redeliveryDelay: Duration
    private var slots: [Slot?] = []
    private var freeSlots: [Int] = []
    private var records: [RecordRef: PendingRecord] = [:]
    private var updates: [Int: PendingUpdate] = [:]
    /// Ledger updates per user in the order they happened: changelog records are written in it.
    private var updateOrder: [UserLane: FIFO<Int>] = [:]
    private var nextUpdateID = 0
    /// Entitlement changes published, by kind (the loop copies them into its statistics).
    private(set) var changesByKind: [String: Int] = [:]
    /// Failed outputs waiting to be produced again (one delay for all: FIFO is due order).
    private var redeliveries = FIFO<(due: ContinuousClock.Instant, token: Int)>()
    /// Users with a change event in flight, and their later change events waiting behind it.
    private var changesInFlight: [UserLane: FIFO<(token: UInt, output: UnsentOutput)>] = [:]
    private var unsent: [(token: UInt, output: UnsentOutput)] = []
    /// Users whose changelog record may be ready: written when outputs are next taken, so what
    /// the loop publishes for them meanwhile (the next request's intent) shares the record.
    private var usersToWrite: [UserLane] = []
    /// Outputs handed out and not answered yet.
    private(set) var awaitingAnswer = 0

    /// Whether a user's ready updates wait for the next ``takeUnsent()`` and share one changelog
    /// record; otherwise each is written alone as soon as it is ready.
    let sharesRecords: Bool

    init(redeliveryDelay: Duration = .milliseconds(500), sharesRecords: Bool = true) {
        self.redeliveryDelay = redeliveryDelay
        self.sharesRecords = sharesRecords
    }

    /// Nothing is being produced, redelivered, held or waiting to be written.
    var isIdle: Bool { awaitingAnswer == 0 && redeliveries.isEmpty && usersToWrite.isEmpty }

    /// Records with outputs not yet acknowledged.
    var pendingRecords: Int { records.count }

    /// Whether any changelog record is not yet acknowledged.
    var hasStateUpdates: Bool { !updates.isEmpty }

    /// Whether a ledger update of a user of requests partition `partition` is not yet acknowledged.
    func hasUpdates(ofPartition partition: Int32) -> Bool {
        updates.values.contains { $0.partition == partition }
    }

    /// Sends an output of `ref`'s record (`nil`: of no record, such as an expiry).
    mutating func send(
        _ output: Output, _ unsentOutput: consuming UnsentOutput, for ref: RecordRef?, item: Item? = nil
    ) {
        if let ref { count(ref, item: item) }
        enqueue(output, unsentOutput, for: ref, update: nil)
    }

    /// Whether an update of the user is not acknowledged yet (its changelog records are not all
    /// in the topic).
    func hasUpdates(ofUser key: String) -> Bool { updateOrder[UserLane(key: key)] != nil }

    /// Publishes a ledger update: `alongside` (the outcome and dead letter whose result the update
    /// records) and its change events now, its changelog record once they and the user's earlier
    /// updates are acknowledged. The record (if any) finishes after all of them. With `intent`,
    /// the update is that item's intent, reported by ``Event/intentWritten(_:)`` once durable.
    /// `user`: the lane of the update's user (`update.key`), when the caller has it (`nil`: built
    /// here, which hashes the key again).
    mutating func publish(
        _ update: consuming LedgerUpdate, for ref: RecordRef?, item: Item? = nil,
        alongside: consuming [(output: Output, unsent: UnsentOutput)] = [], intent: Item? = nil, result: Item? = nil,
        trace: [KafkaHeader] = [], user: UserLane? = nil
    ) {
        // The outputs are moved out rather than copied (with every string they hold).
        var changes = update.changes
        update.changes = []
        for index in changes.indices { changesByKind[changes[index].change.rawValue, default: 0] += 1 }
        let id = nextUpdateID
        nextUpdateID += 1
        assert(user == nil || user!.key == update.key, "the lane of another user than the update's")
        let key = user ?? UserLane(key: update.key)
        updates[id] = PendingUpdate(
            ref: ref, key: key, update: update, unacknowledgedOutputs: alongside.count + changes.count,
            intent: intent, result: result)
        updateOrder[key, default: FIFO()].append(id)
        // The changelog record is counted now, so the record cannot finish before it is written.
        if let ref { count(ref, item: item) }
        alongside.removeAllInOrder { next in
            let (output, unsent) = next
            if let ref { count(ref, item: item) }
            enqueue(output, unsent, for: ref, update: id)
        }
        changes.removeAllInOrder { change in
            if let ref { count(ref, item: item) }
            enqueue(.entitlementChange(update: id), .change(change, trace: trace), for: ref, update: id)
        }
        writeStateIfReady(ofUser: key)
    }

    /// The outputs to produce, in order; each is answered with its token.
    mutating func takeUnsent() -> [(token: UInt, output: UnsentOutput)] {
        for key in usersToWrite { writeStateIfReady(ofUser: key) }
        usersToWrite.removeAll(keepingCapacity: true)
        return unsent.takeAll()
    }

    /// Whether outputs are waiting to be handed out.
    var hasUnsent: Bool { !unsent.isEmpty || !usersToWrite.isEmpty }

    /// The broker's answers.
    mutating func delivered(_ deliveries: [KafkaDelivery], now: ContinuousClock.Instant) -> [Event] {
        var events: [Event] = []
        for delivery in deliveries {
            let token = Int(delivery.token)
            guard token < slots.count, slots[token] != nil else { continue }
            awaitingAnswer -= 1
            if let error = delivery.error {
                let redelivery = slots[token]!.redelivery
                let topic = delivery.record?.topic ?? redelivery?.topic ?? "?"
                if error.isRetriableDelivery, let record = delivery.record ?? redelivery {
                    slots[token]!.redelivery = record
                    redeliveries.append((now.advanced(by: redeliveryDelay), token))
                    events.append(.redelivering(topic: topic, error))
                } else {
                    free(token)
                    events.append(.fatal(topic: topic, error))
                }
                continue
            }
            // (Moved out, not copied: a copy would retain and release what the slot holds.)
            let slot = slots[token].take()!
            freeSlots.append(token)
            acknowledged(slot, into: &events)
        }
        return events
    }

    /// Produces again the failed outputs that are due.
    mutating func tick(now: ContinuousClock.Instant) {
        while let first = redeliveries.first, first.due <= now {
            _ = redeliveries.popFirst()
            guard let record = slots[first.token]?.redelivery else { continue }
            awaitingAnswer += 1
            unsent.append((UInt(first.token), .record(record)))
        }
    }

    private mutating func count(_ ref: RecordRef, item: Item?) {
        if records[ref] == nil {
            records[ref] = PendingRecord(outputs: 1, item: item)
        } else {
            records[ref]!.outputs += 1
        }
    }

    private mutating func enqueue(
        _ output: Output, _ unsentOutput: consuming UnsentOutput, for ref: RecordRef?, update: Int?
    ) {
        let slot = Slot(ref: ref, output: output, update: update)
        let token: Int
        if let free = freeSlots.popLast() {
            token = free
            slots[token] = slot
        } else {
            token = slots.count
            slots.append(slot)
        }
        // A user's change event waits behind the user's change in flight.
        if case .entitlementChange(let id) = output, let key = updates[id]?.key {
            if changesInFlight[key] != nil {
                changesInFlight[key]!.append((UInt(token), unsentOutput))
                return
            }
            changesInFlight[key] = FIFO()
        }
        awaitingAnswer += 1
        unsent.append((UInt(token), unsentOutput))
    }

    private mutating func free(_ token: Int) {
        slots[token] = nil
        freeSlots.append(token)
    }

    /// The user's change in flight was acknowledged: the next one goes.
    private mutating func changeAcknowledged(ofUser key: UserLane) {
        if let next = changesInFlight[key]?.popFirst() {
            awaitingAnswer += 1
            unsent.append(next)
        } else {
            changesInFlight[key] = nil
        }
    }

    private mutating func acknowledged(_ slot: Slot, into events: inout [Event]) {
        events.append(.acknowledged(slot.output))
        if case .entitlementChange(let id) = slot.output, let key = updates[id]?.key {
            changeAcknowledged(ofUser: key)
        }
        if let id = slot.update, let update = updates[id] {
            update.unacknowledgedOutputs -= 1
            if update.unacknowledgedOutputs == 0, let result = update.result {
                events.append(.resultReady(result))
            }
            mayWrite(ofUser: update.key)
        }
        if case .entitlementState(let id) = slot.output, let record = updates[id] {
            record.unwrittenRecords -= 1
            if !record.deferredJournal.isEmpty {
                // The state is durable: the journal records that claim it follow (moved out, in order).
                var journal: [JournalRecord] = []
                swap(&journal, &record.deferredJournal)
                journal.removeAllInOrder { entry in
                    enqueue(
                        .entitlementState(update: id), .journal(entry, partition: record.partition), for: nil,
                        update: nil)
                }
            }
            guard record.unwrittenRecords == 0 else {
                if let ref = slot.ref { outputAcknowledged(of: ref, into: &events) }
                return
            }
            let key = record.key
            // The record's updates are the user's oldest, in order. (Taken out and put back: popping
            // in place, through the dictionary's accessor, allocates its coroutine frame each time.)
            if var order = updateOrder.removeValue(forKey: key) {
                for _ in 0..<record.covering {
                    guard let covered = order.popFirst(), let update = updates.removeValue(forKey: covered) else {
                        break
                    }
                    if let intent = update.intent { events.append(.intentWritten(intent)) }
                    if let ref = update.ref { outputAcknowledged(of: ref, into: &events) }
                }
                if !order.isEmpty { updateOrder[key] = order }
            }
            mayWrite(ofUser: key)
        }
        if let ref = slot.ref { outputAcknowledged(of: ref, into: &events) }
    }

    /// The user's next changelog record may be ready: written now, or at the next ``takeUnsent()``.
    private mutating func mayWrite(ofUser key: UserLane) {
        if sharesRecords { usersToWrite.append(key) } else { writeStateIfReady(ofUser: key) }
    }

    private mutating func outputAcknowledged(of ref: RecordRef, into events: inout [Event]) {
        guard let pending = records[ref] else { return }
        if pending.outputs > 1 {
            records[ref]!.outputs -= 1
        } else {
            records[ref] = nil
            events.append(.recordDone(ref, pending.item))
        }
    }

    /// Writes the user's oldest unwritten changelog records when their outputs are acknowledged and
    /// the user's earlier ones are. Later updates that are ready too are written with them: the
    /// latest state holds theirs (the state of the last of them that changed it: an update of the
    /// journal alone changed nothing since, and may carry the user's identity only); each journal
    /// record is written (a result, and the intent of the next request). A state record goes first,
    /// alone, and the journal records only once it is acknowledged (even after a redelivery): a
    /// durable result never claims a state that is not.
    private mutating func writeStateIfReady(ofUser key: UserLane) {
        guard let order = updateOrder[key], let first = order.first, let update = updates[first],
            update.unacknowledgedOutputs == 0, !update.isWritten
        else { return }
        var last = first
        var covering = 1
        var written = update
        var writesState = update.writesState
        var stateSource = update.writesState ? update : nil
        // The first update's journal record; the later ones' (an array only when there are any).
        var firstJournal = update.takeJournal()
        var laterJournal: [JournalRecord] = []
        while sharesRecords, covering < order.count, let later = updates[order[covering]],
            later.unacknowledgedOutputs == 0
        {
            written.isWritten = true
            last = order[covering]
            written = later
            writesState = writesState || later.writesState
            if later.writesState { stateSource = later }
            if let record = later.takeJournal() {
                if laterJournal.isEmpty, let first = firstJournal.take() { laterJournal.append(first) }
                // A later record of the same slot replaces the earlier one: only the last is written.
                // (Updates of one user: the same seq is the same slot.)
                if let same = laterJournal.lastIndex(where: { $0.seq == record.seq }) {
                    laterJournal.remove(at: same)
                }
                laterJournal.append(record)
            }
            covering += 1
        }
        written.isWritten = true
        written.covering = covering
        // (`firstJournal` is nil once moved into `laterJournal`, whose count then includes it.)
        let journalCount = laterJournal.isEmpty ? (firstJournal == nil ? 0 : 1) : laterJournal.count
        // Every update writes a record (a journal update journals; a state update changes it).
        if journalCount == 0 { writesState = true }
        written.unwrittenRecords = (writesState ? 1 : 0) + journalCount
        // Counted with their updates already (each acknowledged with the last record).
        if writesState {
            written.deferredJournal = laterJournal.isEmpty ? firstJournal.take().map { [$0] } ?? [] : laterJournal
            // (Forced above, with no update that changed the state: then none has a journal record,
            // so each is a state update, which holds the whole state.)
            let source = stateSource ?? written
            precondition(source.holdsState, "a changelog state record from an update that holds no state")
            enqueue(
                .entitlementState(update: last), .state(source.takeState(), partition: written.partition), for: nil,
                update: nil)
        } else if laterJournal.isEmpty, let first = firstJournal.take() {
            enqueue(
                .entitlementState(update: last), .journal(first, partition: written.partition), for: nil,
                update: nil)
        } else {
            laterJournal.removeAllInOrder { record in
                enqueue(
                    .entitlementState(update: last), .journal(record, partition: written.partition), for: nil,
                    update: nil)
            }
        }
    }
}
