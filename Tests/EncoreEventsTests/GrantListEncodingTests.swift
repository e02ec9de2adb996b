import Testing

@testable import EncoreEvents

/// A record's grants are encoded once per list: every write must still hold the grants the record
/// holds at that moment, exactly as writing each grant would.
@Suite("Grant list (encoded once per list)")
struct GrantListEncodingTests {
    typealias Grant = EntitlementStateRecord.Grant

    static func grant(_ product: String, active: Bool = true) -> Grant {
        Grant(
            productID: product, entitlement: Entitlement(type: .discount, value: 20, unit: .percent),
            status: .verified, isActive: active, grantedAtMs: 1_000, expiresAtMs: active ? nil : 2_000,
            requestID: "req-\(product)", campaignID: "spring \"sale\"")
    }

    /// What the record's `grants` would be written as, each grant in turn.
    static func plainJSON(_ grants: [Grant]) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginArray()
        for grant in grants { Grant.table.write(grant, to: &writer) }
        writer.endArray()
        return writer.bytes
    }

    static func listJSON(_ record: EntitlementStateRecord) -> [UInt8] {
        var writer = JSONWriter()
        record.grantList.write(to: &writer, 1000)
        return writer.bytes
    }

    @Test("none, one and several grants are written as each grant would be")
    func sameAsPlain() throws {
        for grants in [[], [Self.grant("a")], [Self.grant("a"), Self.grant("b", active: false), Self.grant("c")]] {
            let record = EntitlementStateRecord(appID: "app", appUserID: "u", grants: grants)
            #expect(Self.listJSON(record) == Self.plainJSON(grants))
            // Twice: the second write is the kept JSON.
            #expect(Self.listJSON(record) == Self.plainJSON(grants))
            #expect(try EntitlementStateRecord(jsonBytes: record.jsonBytes()) == record)
        }
    }

    @Test("a change after a write is in the next write, and a copy written before keeps its own")
    func changesAreWritten() throws {
        var record = EntitlementStateRecord(appID: "app", appUserID: "u", grants: [Self.grant("a")])
        let before = record
        _ = record.jsonBytes()
        record.grants[0].isActive = false
        record.grants.append(Self.grant("b"))
        #expect(Self.listJSON(record) == Self.plainJSON(record.grants))
        #expect(try EntitlementStateRecord(jsonBytes: record.jsonBytes()).grants == record.grants)
        #expect(Self.listJSON(before) == Self.plainJSON([Self.grant("a")]))
        // Equal grants are equal records, whatever was written before.
        var same = before
        same.grants = [Self.grant("a")]
        #expect(same == before && same.hashValue == before.hashValue)
    }
}
