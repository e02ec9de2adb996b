import EncoreEvents
import Kafka
import Synchronization

/// Turns outcomes and dead letters into records with their CloudEvents headers. Pure and
/// `Sendable`, so encoding runs beside the processor's loop rather than on it.
struct OutputEncoder: Sendable {
    let outcomesTopic: String
    let deadLetterTopic: String
    let entitlementsTopic: String
    let stateTopic: String
    /// The headers that never change, per event type (`ce_id` and `ce_time` are filled per record).
    private let outcomeHeaders: HeaderTemplate
    private let changeHeaders: HeaderTemplate
    private let stateHeaders: HeaderTemplate
    private let journalHeaders: HeaderTemplate
    /// Journal slots per user (`--dedupe-per-user`): a journal record's key is its slot's.
    let journalSlots: Int
    private let deadLetterHeaders: HeaderTemplate
    /// The last `ce_time` value: outputs of the same millisecond share it.
    private let lastTime = LastTime()

    init(configuration: ProcessorConfiguration) {
        outcomesTopic = configuration.outcomesTopic
        deadLetterTopic = configuration.deadLetterTopic
        entitlementsTopic = configuration.entitlementsTopic
        stateTopic = configuration.stateTopic
        outcomeHeaders = HeaderTemplate(source: configuration.source, type: .purchaseOutcome)
        changeHeaders = HeaderTemplate(source: configuration.source, type: .entitlementChanged)
        stateHeaders = HeaderTemplate(source: configuration.source, type: .entitlementState)
        journalHeaders = HeaderTemplate(source: configuration.source, type: .requestJournal)
        journalSlots = configuration.journal.perUserCap
        deadLetterHeaders = HeaderTemplate(source: configuration.source, type: .deadLetter)
    }

    func record(for output: consuming UnsentOutput) -> KafkaProducerRecord {
        // (Consumed: bound from a borrowed output, its payload was copied.)
        switch consume output {
        case .outcome(let outcome, let trace): traced(record(for: outcome), trace)
        case .change(let change, let trace): traced(record(for: change), trace)
        case .state(let state, let partition): record(forState: state, partition: partition)
        case .journal(let entry, let partition): record(forJournal: entry, partition: partition)
        case .deadLetter(let letter, let key, let trace): traced(record(for: letter, key: key), trace)
        case .record(let record): record
        }
    }

    private func traced(_ record: KafkaProducerRecord, _ trace: [KafkaHeader]) -> KafkaProducerRecord {
        guard !trace.isEmpty else { return record }
        var record = record
        record.headers += trace
        return record
    }

    func record(for outcome: PurchaseOutcomeEvent) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: outcomesTopic, key: Self.bytes(outcome.appID, ":", outcome.appUserID), value: outcome.jsonBytes(),
            headers: headers(
                outcomeHeaders, id: Self.bytes("outcome:", outcome.requestID), timeMs: outcome.completedAtMs))
    }

    func record(for letter: DeadLetterEvent, key: [UInt8]?) -> KafkaProducerRecord {
        KafkaProducerRecord(
            topic: deadLetterTopic, key: key, value: letter.jsonBytes(),
            headers: headers(
                deadLetterHeaders,
                id: Array(
                    "deadletter:\(letter.originalTopic)/\(letter.originalPartition)/\(letter.originalOffset)".utf8),
                timeMs: letter.failedAtMs))
    }

    /// `ce_id` is `entitlement:{user key}:{sequence}:{digest}`, the digest (64-bit FNV-1a, hex) of
    /// the event's JSON: equal ids mean equal content. A change published again unchanged (its
    /// changelog record was lost in a crash) keeps its id; a redo whose content differs (another
    /// time, another grant) under the same sequence number gets another id, so a reader can tell.
    func record(for change: EntitlementChangeEvent) -> KafkaProducerRecord {
        let value = change.jsonBytes()
        return KafkaProducerRecord(
            topic: entitlementsTopic, key: Array(change.key.utf8), value: value,
            headers: headers(
                changeHeaders, id: Array("entitlement:\(change.key):\(change.sequence):\(Self.digest(value))".utf8),
                timeMs: change.effectiveAtMs))
    }

    /// 64-bit FNV-1a of `bytes`, as 16 hex digits.
    static func digest(_ bytes: [UInt8]) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }

    /// The user's whole state, to the partition of the user's requests (co-partitioned).
    func record(forState state: EntitlementStateRecord, partition: Int32) -> KafkaProducerRecord {
        let key = Self.bytes(state.appID, ":", state.appUserID)
        var id: [UInt8] = []
        id.reserveCapacity(key.count + 48)
        id.append(contentsOf: "state:".utf8)
        id.append(contentsOf: key)
        id.append(UInt8(ascii: ":"))
        id.append(contentsOf: String(state.sequence).utf8)
        id.append(UInt8(ascii: ":"))
        id.append(contentsOf: String(state.updatedAtMs).utf8)
        return KafkaProducerRecord(
            topic: stateTopic, partition: partition, key: key, value: state.jsonBytes(),
            headers: headers(stateHeaders, id: id, timeMs: state.updatedAtMs))
    }

    /// A request's journal entry, keyed by the user's slot, to the partition of the user's requests.
    /// `ce_id` is `journal:{request_id}:{attempts}`, with `:{result}` once it has one.
    func record(forJournal record: JournalRecord, partition: Int32) -> KafkaProducerRecord {
        var id: [UInt8] = []
        id.reserveCapacity(record.entry.requestID.utf8.count + 32)
        id.append(contentsOf: "journal:".utf8)
        id.append(contentsOf: record.entry.requestID.utf8)
        id.append(UInt8(ascii: ":"))
        id.append(contentsOf: String(record.entry.attempts).utf8)
        if let result = record.entry.result {
            id.append(UInt8(ascii: ":"))
            id.append(contentsOf: result.rawValue.utf8)
        }
        return KafkaProducerRecord(
            topic: stateTopic, partition: partition, key: record.key(slotCount: journalSlots),
            value: record.jsonBytes(),
            headers: headers(
                journalHeaders, id: id, timeMs: record.entry.completedAtMs ?? record.entry.startedAtMs))
    }

    private func headers(_ template: HeaderTemplate, id: [UInt8], timeMs: Int64) -> [KafkaHeader] {
        var headers = template.headers
        headers[template.id].value = id
        headers[template.time].value = lastTime.rfc3339(ms: timeMs)
        return headers
    }

    /// The UTF-8 bytes of the strings one after the other, in one allocation (no variadic array).
    private static func bytes(_ first: String, _ second: String, _ third: String = "") -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(first.utf8.count + second.utf8.count + third.utf8.count)
        bytes.append(contentsOf: first.utf8)
        bytes.append(contentsOf: second.utf8)
        bytes.append(contentsOf: third.utf8)
        return bytes
    }
}

/// One event type's CloudEvents headers, with where its per-record `ce_id` and `ce_time` go.
private struct HeaderTemplate: Sendable {
    let headers: [KafkaHeader]
    let id: Int
    let time: Int

    init(source: String, type: EventType) {
        headers = CloudEventHeaders(id: "", source: source, type: type, timeMs: 0).headers.map {
            KafkaHeader(key: $0.key, string: $0.value)
        }
        // (Both are always there: the id and time are given.)
        id = headers.firstIndex { $0.key == "ce_id" }!
        time = headers.firstIndex { $0.key == "ce_time" }!
    }
}

/// `ce_time` of the latest millisecond asked for, formatted once for all outputs of that millisecond.
private final class LastTime: Sendable {
    private let last = Mutex<(ms: Int64, bytes: [UInt8])>((-1, []))

    func rfc3339(ms: Int64) -> [UInt8] {
        last.withLock { last in
            if last.ms != ms { last = (ms, CloudEventHeaders.rfc3339Bytes(ms: ms)) }
            return last.bytes
        }
    }
}
