import EncoreEvents
import Kafka

/// Checks a purchase pipeline's topics against its promises: every valid request answered once,
/// in each user's order, every entitlement change caused by an outcome or a source, and the
/// ledger's changelog what the changes add up to. Fed one topic at a time, in the order of
/// ``Topic``, then asked for its ``AuditReport``.
///
/// Memory grows with the requests in the range (about 100 bytes each: a 64-bit fingerprint of the
/// request id, its coordinates and its first outcome), with 8 bytes per request outside the range,
/// and with the changes and latest changelog record of the users the range touches. Nothing else
/// read is kept.
public struct PipelineAudit: Sendable {
    /// The topics, in the order they must be read.
    public enum Topic: Int, Sendable, CaseIterable, Comparable {
        case requests, outcomes, sources, changes, state, deadLetters

        public static func < (lhs: Topic, rhs: Topic) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    /// Where a record is: what each example names.
    public struct Coordinates: Sendable, Hashable {
        public var topic: String
        public var partition: Int32
        public var offset: Int64
    }

    /// The record-timestamp range of the requests audited: `from` inclusive, `to` exclusive.
    public struct TimeRange: Sendable {
        public var fromMs: Int64?
        public var toMs: Int64?

        public init(fromMs: Int64? = nil, toMs: Int64? = nil) {
            self.fromMs = fromMs
            self.toMs = toMs
        }

        public func contains(_ ms: Int64) -> Bool {
            (fromMs.map { ms >= $0 } ?? true) && (toMs.map { ms < $0 } ?? true)
        }
    }

    let range: TimeRange
    let topicNames: [Topic: String]
    /// Whether a sources topic is read (access flips may then be explained only by its events).
    let readsSources: Bool

    // Requests in the range, and the fingerprints of every other request in the topic.
    var requests: [RequestFacts] = []
    private var requestIndex: [UInt64: Int32] = [:]
    /// Ids whose fingerprint another id already took (never seen in practice; kept correct anyway).
    private var collided: [String: Int32] = [:]
    private var ids = IDArena()
    private var otherRequests = Set<UInt64>()
    var resentRequests = 0
    /// Each requests and outcomes partition's first record held: offset and timestamp.
    private var firstHeld: [Topic: [Int32: (offset: Int64, timestampMs: Int64)]] = [:]
    /// Topics with a partition retention emptied: when their records start is unknown.
    private var emptied = Set<Topic>()
    /// Once the requests are read: the time from which every partition holds its requests.
    private var heldFrom: Int64?? = nil
    /// When the reading of each topic began: a live pipeline goes on writing meanwhile.
    private var readingStarted: [Topic: Int64] = [:]
    var invalid: [Coordinates] = []
    private var invalidSet = Set<Coordinates>()
    var invalidIDs: [String?] = []

    // The users the range's requests belong to.
    private var userIndex: [String: Int32] = [:]
    var users: [UserFacts] = []

    /// Requests-topic records a dead letter names.
    var deadLettered = Set<Coordinates>()
    /// Partitions of the changes topic read from offset 0: their users' histories are whole.
    var changePartitionsFromStart = Set<Int32>()

    // What every discrepancy and figure counts.
    var report: AuditReport

    public init(range: TimeRange, topics: [Topic: String]) {
        self.range = range
        self.topicNames = topics
        self.readsSources = topics[.sources] != nil
        self.report = AuditReport(range: range)
    }

    // MARK: Reading

    /// Says that the reading of `topic` begins now (`nowMs`), with these watermarks of its
    /// partitions (a low one above 0: retention deleted records). Records written later are
    /// read too; what was read earlier is not re-read.
    public mutating func startReading(
        _ topic: Topic, nowMs: Int64, watermarks: [Int32: (low: Int64, high: Int64)] = [:]
    ) {
        readingStarted[topic] = nowMs
        if watermarks.values.contains(where: { $0.low > 0 && $0.low >= $0.high }) { emptied.insert(topic) }
    }

    /// Reads one record of `topic`; the topics must be read in the order of ``Topic``.
    public mutating func read(_ message: KafkaMessage, of topic: Topic) {
        switch topic {
        case .requests: readRequest(message)
        case .outcomes: readOutcome(message)
        case .sources: readSource(message)
        case .changes: readChange(message)
        case .state: readState(message)
        case .deadLetters: readDeadLetter(message)
        }
    }

    private mutating func noteFirst(_ message: KafkaMessage, of topic: Topic) {
        if firstHeld[topic]?[message.partition] == nil {
            firstHeld[topic, default: [:]][message.partition] = (message.offset, message.timestampMs ?? 0)
        }
    }

    private mutating func readRequest(_ message: KafkaMessage) {
        noteFirst(message, of: .requests)
        let inRange = range.contains(message.timestampMs ?? 0)
        guard let request = try? PurchaseRequestEvent(jsonBytes: message.value) else {
            guard inRange else { return }
            invalid.append(coordinates(message, .requests))
            invalidSet.insert(coordinates(message, .requests))
            invalidIDs.append(PurchaseRequestEvent.requestIDHint(message.value))
            return
        }
        let fingerprint = Self.fingerprint(request.requestID)
        guard inRange else {
            otherRequests.insert(fingerprint)
            return
        }
        if lookup(request.requestID, fingerprint) != nil || otherRequests.contains(fingerprint) {
            // A re-send of a request id already read: answered by the first (the journal).
            resentRequests += 1
            return
        }
        if let run = request.loadTestRun {
            report.figures.loadTestRequests[run, default: 0] += 1
        }
        let index = Int32(requests.count)
        if requestIndex[fingerprint] == nil {
            requestIndex[fingerprint] = index
        } else {
            collided[request.requestID] = index
        }
        let user = userNumber(request.key, create: true)!
        let id = ids.append(request.requestID)
        requests.append(
            RequestFacts(
                partition: message.partition, offset: message.offset, timestampMs: message.timestampMs ?? 0,
                user: user, idStart: id.start, idLength: id.length, product: Self.fingerprint(request.productID)))
    }

    private mutating func readOutcome(_ message: KafkaMessage) {
        noteFirst(message, of: .outcomes)
        guard let outcome = try? PurchaseOutcomeEvent(jsonBytes: message.value) else {
            report.figures.undecodableOutcomes += 1
            return
        }
        let fingerprint = Self.fingerprint(outcome.requestID)
        let place = coordinates(message, .outcomes)
        guard let index = lookup(outcome.requestID, fingerprint) else {
            if otherRequests.contains(fingerprint) {
                // Answers a request outside the range: kept only when a user of the range may need
                // it to explain an entitlement change.
                if let user = userNumber(outcome.key, create: false), users[Int(user)].outcomes[fingerprint] == nil {
                    users[Int(user)].outcomes[fingerprint] = OutcomeFacts(
                        result: outcome.result, product: Self.fingerprint(outcome.productID))
                }
            } else if range.contains(outcome.completedAtMs),
                outcome.requestedAtMs >= requestsHeldFrom() ?? .min,
                // Answers a request produced after the requests were read (a live pipeline).
                outcome.completedAtMs < readingStarted[.requests] ?? .max
            {
                report.add(.orphanOutcomes, AuditReport.Example(requestID: outcome.requestID, at: place))
            }
            return
        }
        let request = requests[Int(index)]
        if request.inDoubt && !outcome.isInDoubt {
            // The one final outcome an in-doubt request may have after its `pending`.
            requests[Int(index)].inDoubt = false
            requests[Int(index)].outcome = outcome.result
            report.figures.inDoubtResolved += 1
            report.figures.resolvedInDoubtByResult[outcome.result.rawValue, default: 0] += 1
            return
        }
        if let first = request.outcome {
            let example = AuditReport.Example(
                requestID: outcome.requestID, at: place,
                detail:
                    "first \(first.rawValue) at \(topicNames[.outcomes]!)[\(request.outcomePartition)]@\(request.outcomeOffset)"
            )
            report.add(first == outcome.result ? .duplicateOutcomes : .conflictingOutcomes, example)
            return
        }
        requests[Int(index)].outcome = outcome.result
        if outcome.isInDoubt {
            requests[Int(index)].inDoubt = true
            report.figures.inDoubtOpened += 1
        }
        requests[Int(index)].outcomePartition = message.partition
        requests[Int(index)].outcomeOffset = message.offset
        report.figures.record(outcome, requestTimestampMs: request.timestampMs)
    }

    private mutating func readSource(_ message: KafkaMessage) {
        guard let event = try? EntitlementSourceEvent(jsonBytes: message.value),
            let user = userNumber(event.key, create: false)
        else { return }
        users[Int(user)].hasSourceEvents = true
    }

    private mutating func readChange(_ message: KafkaMessage) {
        guard let change = try? EntitlementChangeEvent(jsonBytes: message.value) else {
            report.figures.undecodableChanges += 1
            return
        }
        if message.offset == 0 { changePartitionsFromStart.insert(message.partition) }
        guard let user = userNumber(change.key, create: false) else { return }
        if range.contains(change.effectiveAtMs) {
            report.figures.changesByKind[change.change.rawValue, default: 0] += 1
        }
        users[Int(user)].changes.append(
            ChangeFacts(
                sequence: change.sequence, kind: change.change, access: change.access, isActive: change.isActive,
                status: change.status, entitlement: change.entitlement,
                request: change.requestID.map(Self.fingerprint), requestID: change.requestID,
                namesSources: !(change.sources ?? []).isEmpty, partition: message.partition, offset: message.offset))
    }

    private mutating func readState(_ message: KafkaMessage) {
        guard let key = message.key, let user = userNumber(String(decoding: key, as: UTF8.self), create: false)
        else { return }
        users[Int(user)].latestState = message.value.isEmpty ? nil : message.value
        users[Int(user)].latestStateAt = coordinates(message, .state)
    }

    private mutating func readDeadLetter(_ message: KafkaMessage) {
        guard let letter = try? DeadLetterEvent(jsonBytes: message.value) else {
            report.figures.undecodableDeadLetters += 1
            return
        }
        let belongs: Bool
        if letter.originalTopic == topicNames[.requests] {
            let origin = Coordinates(
                topic: letter.originalTopic, partition: letter.originalPartition, offset: letter.originalOffset)
            deadLettered.insert(origin)
            belongs =
                letter.requestID.flatMap { lookup($0, Self.fingerprint($0)) } != nil || invalidSet.contains(origin)
        } else {
            belongs = range.contains(letter.failedAtMs)
        }
        if belongs { report.figures.recordDeadLetter(letter) }
    }

    /// When retention deleted the first requests of a partition: the time from which every
    /// partition holds its requests. An outcome of an older request may have lost its request to
    /// retention; it is not called an orphan.
    private mutating func requestsHeldFrom() -> Int64? {
        if let known = heldFrom { return known }
        let from = Self.heldFrom(firstHeld[.requests] ?? [:], emptied: emptied.contains(.requests))
        heldFrom = .some(from)
        report.figures.requestsHeldFromMs = from
        return from
    }

    /// The time from which every partition holds its records; `nil` when retention deleted none,
    /// `Int64.max` when it emptied a partition (no time is known to be whole).
    static func heldFrom(_ first: [Int32: (offset: Int64, timestampMs: Int64)], emptied: Bool) -> Int64? {
        if emptied { return .max }
        guard first.values.contains(where: { $0.offset > 0 }) else { return nil }
        return first.values.map(\.timestampMs).max()
    }

    /// When the outcomes topic holds every outcome from (retention may have deleted older ones).
    var outcomesHeldFrom: Int64? { Self.heldFrom(firstHeld[.outcomes] ?? [:], emptied: emptied.contains(.outcomes)) }

    /// When the reading of the changes began (a changelog record written after may be newer).
    var changesReadFrom: Int64 { readingStarted[.changes] ?? .max }

    // MARK: Lookups

    /// The first outcome of the request a change names: kept with the request when it is in the
    /// range, in the user's facts otherwise.
    func outcome(of change: ChangeFacts, _ user: UserFacts) -> OutcomeFacts? {
        guard let fingerprint = change.request, let id = change.requestID else { return nil }
        guard let index = lookup(id, fingerprint) else { return user.outcomes[fingerprint] }
        let request = requests[Int(index)]
        return request.outcome.map { OutcomeFacts(result: $0, product: request.product) }
    }

    private func lookup(_ requestID: String, _ fingerprint: UInt64) -> Int32? {
        guard let index = requestIndex[fingerprint] else { return nil }
        let facts = requests[Int(index)]
        if ids.equals(requestID, start: facts.idStart, length: facts.idLength) { return index }
        return collided[requestID]
    }

    private mutating func userNumber(_ key: String, create: Bool) -> Int32? {
        if let number = userIndex[key] { return number }
        guard create else { return nil }
        let number = Int32(users.count)
        userIndex[key] = number
        users.append(UserFacts(key: key))
        return number
    }

    func requestID(of facts: RequestFacts) -> String { ids.string(start: facts.idStart, length: facts.idLength) }

    func coordinates(_ message: KafkaMessage, _ topic: Topic) -> Coordinates {
        Coordinates(topic: topicNames[topic] ?? message.topic, partition: message.partition, offset: message.offset)
    }

    /// FNV-1a over the UTF-8 bytes, then a 64-bit finaliser: an id's fingerprint.
    static func fingerprint(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
        hash ^= hash >> 33
        hash = hash &* 0xff51_afd7_ed55_8ccd
        return hash ^ (hash >> 33)
    }
}

// MARK: - What is kept

/// A request of the range and its first outcome.
struct RequestFacts: Sendable {
    var partition: Int32
    var offset: Int64
    var timestampMs: Int64
    var user: Int32
    var idStart: Int32
    var idLength: Int32
    var product: UInt64
    /// The first outcome's result; once an in-doubt request's final outcome is read, that one's.
    var outcome: OutcomeResult? = nil
    /// Its outcomes so far are one `pending` with `outcome_unknown`: a final outcome may follow.
    var inDoubt = false
    var outcomePartition: Int32 = 0
    var outcomeOffset: Int64 = 0
}

struct OutcomeFacts: Sendable {
    var result: OutcomeResult
    var product: UInt64
}

struct ChangeFacts: Sendable {
    var sequence: Int64
    var kind: EntitlementChangeKind
    var access: String?
    var isActive: Bool
    var status: EntitlementStatus?
    var entitlement: Entitlement?
    var request: UInt64?
    var requestID: String?
    var namesSources: Bool
    var partition: Int32
    var offset: Int64
}

/// A user the range's requests belong to: the outcomes of their requests outside the range, their
/// changes and their latest changelog record.
struct UserFacts: Sendable {
    let key: String
    var outcomes: [UInt64: OutcomeFacts] = [:]
    var changes: [ChangeFacts] = []
    var hasSourceEvents = false
    var latestState: [UInt8]? = nil
    var latestStateAt: PipelineAudit.Coordinates? = nil
}

/// Request ids, back to back in one buffer: no allocation per id.
struct IDArena: Sendable {
    private var bytes: [UInt8] = []

    mutating func append(_ id: String) -> (start: Int32, length: Int32) {
        let start = Int32(bytes.count)
        bytes.append(contentsOf: id.utf8)
        return (start, Int32(bytes.count) - start)
    }

    func equals(_ id: String, start: Int32, length: Int32) -> Bool {
        id.utf8.elementsEqual(bytes[Int(start)..<Int(start + length)])
    }

    func string(start: Int32, length: Int32) -> String {
        String(decoding: bytes[Int(start)..<Int(start + length)], as: UTF8.self)
    }
}
