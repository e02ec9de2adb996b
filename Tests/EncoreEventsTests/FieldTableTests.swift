import Foundation
import Testing

@testable import EncoreEvents

/// Each event's field table is its one description: these tests hold it to `schemas/` and hold
/// the fast path to the general decoder.
@Suite("Field tables")
struct FieldTableTests {
    static let tables: [(event: String, schema: [FieldSchema])] = [
        ("purchase-request", PurchaseRequestEvent.table.schema),
        ("purchase-outcome", PurchaseOutcomeEvent.table.schema),
        ("entitlement-change", EntitlementChangeEvent.table.schema),
        ("entitlement-source", EntitlementSourceEvent.table.schema),
        ("entitlement-state", EntitlementStateRecord.table.schema),
        ("dead-letter", DeadLetterEvent.table.schema),
        ("request-journal", JournalRecord.table.schema),
    ]

    @Test("every table has a schema in schemas/")
    func everySchemaHasATable() {
        #expect(Set(Self.tables.map(\.event)) == Set(eventNames))
    }

    @Test("a table states exactly what its schema states", arguments: tables.map(\.event))
    func tableMatchesSchema(_ event: String) throws {
        let url = repositoryRoot.appendingPathComponent("schemas/\(event).schema.json")
        let schema = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        let reader = SchemaReader(definitions: schema["$defs"] as? [String: Any] ?? [:])
        let table = try #require(Self.tables.first { $0.event == event }).schema
        compare(table, try reader.fields(of: schema, path: event), path: event)
    }

    /// Compares field by field, so a drift names the field.
    func compare(_ table: [FieldSchema], _ schema: [FieldSchema], path: String) {
        #expect(table.map(\.name).sorted() == schema.map(\.name).sorted(), "\(path): the fields differ")
        for field in table {
            guard let stated = schema.first(where: { $0.name == field.name }) else { continue }
            let fieldPath = "\(path).\(field.name)"
            #expect(field.isRequired == stated.isRequired, "\(fieldPath): required in one, not the other")
            switch (field.shape, stated.shape) {
            case (.object(let mine), .object(let theirs)):
                compare(mine, theirs, path: fieldPath)
            case (.array(let mine, let myItems), .array(let theirs, let theirItems)):
                #expect(mine == theirs, "\(fieldPath): maxItems")
                compare(myItems, theirItems, path: "\(fieldPath)[]")
            case (.enumeration(let mine), .enumeration(let theirs)):
                #expect(mine.sorted() == theirs.sorted(), "\(fieldPath): the values differ")
            default:
                #expect(field.shape == stated.shape, "\(fieldPath)")
            }
        }
    }

    @Test("the fast path answers for what the encoder writes in plain ASCII, and agrees with the general decoder")
    func fastPathAgrees() throws {
        func check<E: EncoreEvent & FieldTabled>(_ type: E.Type, _ events: [E]) -> Int {
            var answered = 0
            for event in events {
                let bytes = event.jsonBytes()
                let fast = bytes.withUnsafeBufferPointer(E.table.decodeFast)
                let general = try? E.table.decodeGeneral(bytes)
                #expect(general == event, "\(String(decoding: bytes, as: UTF8.self))")
                let plain = bytes.allSatisfy { $0 < 0x80 && $0 != UInt8(ascii: "\\") }
                #expect(
                    (fast != nil) == (plain && E.table.fastPath), "\(String(decoding: bytes, as: UTF8.self))")
                if let fast {
                    #expect(fast == general)
                    answered += 1
                }
            }
            return answered
        }
        // The sample events, and the same with plain user ids (theirs hold escapes and emoji).
        let requests = SampleEvents.requests(count: 200)
        let plainRequests = requests.enumerated().map { index, request in
            var plain = request
            plain.appUserID = "user-\(index)"
            return plain
        }
        let states = SampleEvents.states(count: 20)
        let plainStates = states.enumerated().map { index, state in
            var plain = state
            plain.appUserID = "user-\(index)"
            return plain
        }
        #expect(check(PurchaseRequestEvent.self, requests + plainRequests) > 100)
        #expect(check(PurchaseOutcomeEvent.self, SampleEvents.outcomes(for: requests + plainRequests)) > 100)
        #expect(check(EntitlementChangeEvent.self, SampleEvents.changes(count: 50)) == 50)
        let plainSources = SampleEvents.sources(count: 20).enumerated().map { index, source in
            var plain = source
            plain.appUserID = "user-\(index)"
            return plain
        }
        #expect(check(EntitlementSourceEvent.self, SampleEvents.sources(count: 20) + plainSources) == 20)
        #expect(check(EntitlementStateRecord.self, states + plainStates) > 10)
        #expect(check(DeadLetterEvent.self, SampleEvents.deadLetters()) == 0)
        // The samples: wherever the fast path answers, it says what the general decoder says.
        func agreeOnSamples<E: EncoreEvent & FieldTabled>(_ type: E.Type, _ event: String) {
            for sample in allSamples() where sample.event == event {
                let bytes = sample.bytes
                guard let fast = bytes.withUnsafeBufferPointer(E.table.decodeFast) else { continue }
                #expect(fast == (try? E.table.decodeGeneral(bytes)), "\(sample.testDescription)")
            }
        }
        agreeOnSamples(PurchaseRequestEvent.self, "purchase-request")
        agreeOnSamples(PurchaseOutcomeEvent.self, "purchase-outcome")
        agreeOnSamples(EntitlementChangeEvent.self, "entitlement-change")
        agreeOnSamples(EntitlementSourceEvent.self, "entitlement-source")
        agreeOnSamples(EntitlementStateRecord.self, "entitlement-state")
    }

    @Test("a dead letter's message is cut to the contract's limit when written")
    func deadLetterMessageIsCut() throws {
        let long = String(repeating: "é", count: EventLimits.messageLength + 904)
        let letter = DeadLetterEvent(
            topic: "t", partition: 0, offset: 1, key: nil, value: [], headers: [],
            error: .init(stage: .controller, errorClass: "timeout", message: long, retryable: false), attempts: 1,
            failedAtMs: 1)
        let decoded = try DeadLetterEvent(jsonBytes: letter.jsonBytes())
        #expect(decoded.error.message == String(repeating: "é", count: EventLimits.messageLength))
    }

    @Test("an outcome's error past the contract's limits is cut when written: a controller's error is not checked")
    func outcomeErrorIsCut() throws {
        let request = try PurchaseRequestEvent(
            jsonBytes: Array(
                #"{"request_id":"r","app_id":"a","app_user_id":"u","product_id":"p","store":"APP_STORE","environment":"SANDBOX","requested_at_ms":1}"#
                    .utf8))
        let cases = [("", "unnamed"), (String(repeating: "t", count: 200), String(repeating: "t", count: 128))]
        for (type, written) in cases {
            let outcome = PurchaseOutcomeEvent(
                request: request, result: .failed, attempts: 1, completedAtMs: 2, controller: "billing",
                error: .init(type: type, message: String(repeating: "é", count: 5_000), retryable: false))
            let decoded = try PurchaseOutcomeEvent(jsonBytes: outcome.jsonBytes())
            #expect(decoded.error?.type == written)
            #expect(decoded.error?.message == String(repeating: "é", count: EventLimits.messageLength))
        }
    }

    @Test("a rule that spans fields holds on the fast path too")
    func crossFieldRules() {
        let failedWithoutError =
            #"{"request_id":"r","app_id":"a","app_user_id":"u","product_id":"p","result":"failed","attempts":1,"#
            + #""store":"OTHER","environment":"SANDBOX","requested_at_ms":1,"completed_at_ms":2}"#
        let bytes = Array(failedWithoutError.utf8)
        #expect(bytes.withUnsafeBufferPointer(PurchaseOutcomeEvent.table.decodeFast) == nil)
        #expect(throws: EventValidationError.self) { try PurchaseOutcomeEvent(jsonBytes: bytes) }
        let badSource =
            #"{"app_id":"a","app_user_id":"u","source":"rev cat","entitlement_id":"pro","is_active":true,"#
            + #""event_id":"e","occurred_at_ms":1}"#
        #expect(Array(badSource.utf8).withUnsafeBufferPointer(EntitlementSourceEvent.table.decodeFast) == nil)
        #expect(throws: EventValidationError.self) { try EntitlementSourceEvent(jsonBytes: Array(badSource.utf8)) }
    }
}

/// Reads the fields a JSON Schema states, in the vocabulary of ``FieldSchema``: `$ref`s into
/// `$defs`, and the schemas' `if null then true else …` form of a nullable optional.
struct SchemaReader {
    let definitions: [String: Any]

    struct Unreadable: Error, CustomStringConvertible {
        let description: String
    }

    func fields(of object: [String: Any], path: String) throws -> [FieldSchema] {
        let properties = object["properties"] as? [String: Any] ?? [:]
        let required = Set(object["required"] as? [String] ?? [])
        return try properties.keys.sorted().map { name in
            let (shape, nullable) = try self.shape(properties[name], path: "\(path).\(name)")
            // Every optional field may be null (absent), every required one may not.
            guard nullable != required.contains(name) else {
                throw Unreadable(description: "\(path).\(name): nullable and required disagree")
            }
            return FieldSchema(name: name, isRequired: required.contains(name), shape: shape)
        }
    }

    func shape(_ node: Any?, path: String) throws -> (FieldShape, nullable: Bool) {
        guard var node = node as? [String: Any] else { throw Unreadable(description: "\(path): not an object") }
        if let condition = node["if"] as? [String: Any], condition["type"] as? String == "null",
            node["then"] as? Bool == true
        {
            return (try shape(node["else"], path: path).0, true)
        }
        if let reference = node["$ref"] as? String {
            let name = String(reference.dropFirst("#/$defs/".count))
            guard let definition = definitions[name] as? [String: Any] else {
                throw Unreadable(description: "\(path): no definition \(reference)")
            }
            node = definition
        }
        if let values = node["enum"] as? [String] { return (.enumeration(values), false) }
        switch node["type"] as? String {
        case "string":
            return (
                .string(
                    minLength: node["minLength"] as? Int ?? 0, maxLength: node["maxLength"] as? Int,
                    pattern: node["pattern"] as? String), false
            )
        case "integer":
            return (.integer(minimum: Int64(node["minimum"] as? Int ?? Int(Int64.min))), false)
        case "number":
            return (.number(minimum: number(node["minimum"]), maximum: number(node["maximum"])), false)
        case "boolean":
            return (.boolean, false)
        case "array":
            let (items, _) = try shape(node["items"], path: "\(path)[]")
            guard case .object(let fields) = items else { throw Unreadable(description: "\(path): items not objects") }
            return (.array(maxItems: node["maxItems"] as? Int ?? Int.max, items: fields), false)
        case "object":
            if let values = node["additionalProperties"] as? [String: Any] {
                let names = node["propertyNames"] as? [String: Any] ?? [:]
                return (
                    .stringMap(
                        maxProperties: node["maxProperties"] as? Int ?? Int.max,
                        maxKeyLength: names["maxLength"] as? Int ?? Int.max,
                        maxValueLength: values["maxLength"] as? Int ?? Int.max), false
                )
            }
            return (.object(try fields(of: node, path: path)), false)
        default:
            throw Unreadable(description: "\(path): a form the tables do not state")
        }
    }

    private func number(_ value: Any?) -> Double {
        (value as? NSNumber)?.doubleValue ?? .nan
    }
}
