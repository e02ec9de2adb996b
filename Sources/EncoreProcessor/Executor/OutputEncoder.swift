import EncoreEvents
import Kafka
import Synchronization

/// Turns outputs (outcomes, change events, states, journal records, dead letters) into records
/// with their CloudEvents headers (the journal's records without), written into a reused
/// ``KafkaRecordBuffer``. Pure but for the shared `ce_time` of the latest millisecond.
struct OutputEncoder: Sendable {
    let outcomesTopic: String
    let deadLetterTopic: String
    let entitlementsTopic: String
    let stateTopic: String
    /// The headers that never change, per event type (`ce_id` and `ce_time` are filled per record).
    private let outcomeHeaders: HeaderTemplate
    private let changeHeaders: HeaderTemplate
    private let stateHeaders: HeaderTemplate
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
        journalSlots = configuration.journal.perUserCap
        deadLetterHeaders = HeaderTemplate(source: configuration.source, type: .deadLetter)
    }

    /// Encodes `output` into `buffer`, whose bytes are reused record after record (the producer
    /// copies them): an output's encoding allocates nothing once the buffer has grown.
    func encode(_ output: consuming UnsentOutput, into buffer: inout KafkaRecordBuffer) {
        // (Consumed: bound from a borrowed output, its payload was copied.)
        switch consume output {
        case .outcome(let outcome, let trace):
            encode(outcome, into: &buffer)
            append(trace, to: &buffer)
        case .change(let change, let trace):
            encode(change, into: &buffer)
            append(trace, to: &buffer)
        case .state(let state, let partition): encode(state, partition: partition, into: &buffer)
        case .journal(let entry, let partition): encode(journal: entry, partition: partition, into: &buffer)
        case .deadLetter(let letter, let key, let trace):
            encode(letter, key: key, into: &buffer)
            append(trace, to: &buffer)
        case .record(let record): buffer.begin(with: record)
        }
    }

    private func append(_ trace: [KafkaHeader], to buffer: inout KafkaRecordBuffer) {
        for index in trace.indices { buffer.headers.append(trace[index]) }
    }

    private func encode(_ outcome: PurchaseOutcomeEvent, into buffer: inout KafkaRecordBuffer) {
        buffer.begin(topic: outcomesTopic, partition: nil)
        Self.appendKey(outcome.appID, outcome.appUserID, to: &buffer)
        Self.writeValue(into: &buffer) { outcome.write(to: &$0) }
        appendHeaders(outcomeHeaders, to: &buffer, timeMs: outcome.completedAtMs) { id in
            id.append(contentsOf: "outcome:".utf8)
            id.append(contentsOf: outcome.requestID.utf8)
        }
    }

    private func encode(_ letter: DeadLetterEvent, key: [UInt8]?, into buffer: inout KafkaRecordBuffer) {
        buffer.begin(topic: deadLetterTopic, partition: nil)
        if let key {
            buffer.hasKey = true
            buffer.key.append(contentsOf: key)
        }
        Self.writeValue(into: &buffer) { letter.write(to: &$0) }
        appendHeaders(deadLetterHeaders, to: &buffer, timeMs: letter.failedAtMs) { id in
            id.append(
                contentsOf: "deadletter:\(letter.originalTopic)/\(letter.originalPartition)/\(letter.originalOffset)"
                    .utf8)
        }
    }

    /// `ce_id` is `entitlement:{user key}:{sequence}:{digest}`, the digest (64-bit FNV-1a, hex) of
    /// the event's JSON: equal ids mean equal content. A change published again unchanged (its
    /// changelog record was lost in a crash) keeps its id; a redo whose content differs (another
    /// time, another grant) under the same sequence number gets another id, so a reader can tell.
    /// (Written byte by byte into the reused buffers: building the key, the digest's hex and the
    /// id as strings took five allocations a change.)
    private func encode(_ change: EntitlementChangeEvent, into buffer: inout KafkaRecordBuffer) {
        buffer.begin(topic: entitlementsTopic, partition: nil)
        Self.appendKey(change.appID, change.appUserID, to: &buffer)
        Self.writeValue(into: &buffer) { change.write(to: &$0) }
        let digest = Self.fnv1a(buffer.value)
        appendHeaders(changeHeaders, to: &buffer, timeMs: change.effectiveAtMs) { id in
            Self.appendID("entitlement:", change.appID, change.appUserID, change.sequence, to: &id)
            Self.appendHex(digest, to: &id)
        }
    }

    /// 64-bit FNV-1a of `bytes`.
    static func fnv1a(_ bytes: [UInt8]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return hash
    }

    /// `value` as 16 lowercase hex digits.
    static func appendHex(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 60, through: 0, by: -4) {
            let digit = UInt8(truncatingIfNeeded: value >> UInt64(shift)) & 0xf
            bytes.append(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10)
        }
    }

    /// The user's whole state, to the partition of the user's requests (co-partitioned).
    private func encode(_ state: EntitlementStateRecord, partition: Int32, into buffer: inout KafkaRecordBuffer) {
        buffer.begin(topic: stateTopic, partition: partition)
        Self.appendKey(state.appID, state.appUserID, to: &buffer)
        Self.writeValue(into: &buffer) { state.write(to: &$0) }
        appendHeaders(stateHeaders, to: &buffer, timeMs: state.updatedAtMs) { id in
            Self.appendID("state:", state.appID, state.appUserID, state.sequence, to: &id)
            JSONWriter.appendDecimal(state.updatedAtMs, to: &id)
        }
    }

    /// `{prefix}{app_id}:{app_user_id}:{sequence}:`, the start of a change's or a state's `ce_id`.
    private static func appendID(
        _ prefix: StaticString, _ appID: String, _ appUserID: String, _ sequence: Int64, to id: inout [UInt8]
    ) {
        prefix.withUTF8Buffer { id.append(contentsOf: $0) }
        id.append(contentsOf: appID.utf8)
        id.append(UInt8(ascii: ":"))
        id.append(contentsOf: appUserID.utf8)
        id.append(UInt8(ascii: ":"))
        JSONWriter.appendDecimal(sequence, to: &id)
        id.append(UInt8(ascii: ":"))
    }

    /// A request's journal entry, keyed by the user's slot, to the partition of the user's requests.
    /// No CloudEvents headers: the journal is the processor's own bookkeeping, read only by it (the
    /// key tells its records from the users' states), and written twice per request, where six
    /// headers would be nearly half of each record's bytes for the broker to store.
    private func encode(journal record: JournalRecord, partition: Int32, into buffer: inout KafkaRecordBuffer) {
        buffer.begin(topic: stateTopic, partition: partition)
        buffer.hasKey = true
        record.appendKey(slotCount: journalSlots, to: &buffer.key)
        Self.writeValue(into: &buffer) { record.write(to: &$0) }
    }

    /// The template's headers, in order, with the record's `ce_id` (written by `id`) and `ce_time`.
    private func appendHeaders(
        _ template: HeaderTemplate, to buffer: inout KafkaRecordBuffer, timeMs: Int64,
        id: (inout [UInt8]) -> Void
    ) {
        for index in 0..<template.headers.count {
            if index == template.id {
                buffer.headers.append(key: "ce_id", writing: id)
            } else if index == template.time {
                buffer.headers.append(key: "ce_time") { lastTime.append(ms: timeMs, to: &$0) }
            } else {
                buffer.headers.append(template.headers, at: index)
            }
        }
    }

    /// The record's value: JSON written by `write` straight into the buffer's value bytes.
    private static func writeValue(into buffer: inout KafkaRecordBuffer, _ write: (inout JSONWriter) -> Void) {
        var writer = JSONWriter(reusing: buffer.takeValue())
        write(&writer)
        buffer.value = writer.takeBytes()
    }

    /// `{app_id}:{app_user_id}` as the record's key.
    private static func appendKey(_ appID: String, _ appUserID: String, to buffer: inout KafkaRecordBuffer) {
        buffer.hasKey = true
        buffer.key.append(contentsOf: appID.utf8)
        buffer.key.append(UInt8(ascii: ":"))
        buffer.key.append(contentsOf: appUserID.utf8)
    }
}

/// One event type's CloudEvents headers, with where its per-record `ce_id` and `ce_time` go.
private struct HeaderTemplate: Sendable {
    let headers: KafkaHeaderBuffer
    let id: Int
    let time: Int

    init(source: String, type: EventType) {
        let headers = CloudEventHeaders(id: "", source: source, type: type, timeMs: 0).headers
        self.headers = KafkaHeaderBuffer(headers.map { KafkaHeader(key: $0.key, string: $0.value) })
        // (Both are always there: the id and time are given.)
        id = headers.firstIndex { $0.key == "ce_id" }!
        time = headers.firstIndex { $0.key == "ce_time" }!
    }
}

/// `ce_time` of the latest millisecond asked for, formatted once for all outputs of that millisecond.
private final class LastTime: Sendable {
    private let last = Mutex<(ms: Int64, bytes: [UInt8])>((-1, []))

    /// Appends the `ce_time` value of `ms` to `bytes`.
    func append(ms: Int64, to bytes: inout [UInt8]) {
        last.withLock { last in
            if last.ms != ms { last = (ms, CloudEventHeaders.rfc3339Bytes(ms: ms)) }
            bytes.append(contentsOf: last.bytes)
        }
    }
}
