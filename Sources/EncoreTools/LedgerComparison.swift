import EncoreEvents

/// The users whose grants or access answers differ between production's ledger and a replay's
/// (`audit --compare PREFIX`). Times are left out: a replay grants later than production did.
public struct LedgerComparison: Sendable {
    /// What a user holds, as compared.
    public struct Holding: Sendable, Hashable {
        /// `product: type value unit status active|inactive`, sorted.
        public var grants: [String]
        public var access: [String: Bool]

        public init(_ state: EntitlementStateRecord) {
            grants = state.grants.map { grant in
                let entitlement = grant.entitlement
                let value =
                    entitlement.value == entitlement.value.rounded()
                    ? String(Int64(entitlement.value)) : String(entitlement.value)
                return
                    "\(grant.productID): \(entitlement.type.rawValue) \(value) \(entitlement.unit.rawValue) \(grant.status.rawValue) \(grant.isActive ? "active" : "inactive")"
            }.sorted()
            access = state.access
        }

        static let none = Holding(grants: [], access: [:])

        private init(grants: [String], access: [String: Bool]) {
            self.grants = grants
            self.access = access
        }

        var summary: String {
            let rules = access.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value ? "active" : "inactive")" }
            let parts = (grants.isEmpty ? ["no grants"] : grants) + rules
            return parts.joined(separator: "; ")
        }
    }

    public struct Difference: Sendable, Hashable {
        public var user: String
        public var production: Holding
        public var shadow: Holding
    }

    public let prefix: String
    /// Users of the replay, all compared.
    public let compared: Int
    public let differences: [Difference]

    /// Compares each user of `shadow` with the same user in `production` (latest changelog records).
    public init(prefix: String, production: [String: EntitlementStateRecord], shadow: [String: EntitlementStateRecord])
    {
        self.prefix = prefix
        compared = shadow.count
        differences = shadow.keys.sorted().compactMap { user in
            let replayed = Holding(shadow[user]!)
            let held = production[user].map(Holding.init) ?? .none
            return replayed == held ? nil : Difference(user: user, production: held, shadow: replayed)
        }
    }

    public func json() -> String {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("compare", prefix)
        writer.field("compared_users", compared)
        writer.field("differing_users", differences.count)
        writer.objects("differences", differences) { writer, difference in
            writer.field("user", difference.user)
            for (name, holding) in [("production", difference.production), ("shadow", difference.shadow)] {
                writer.key(dynamic: name)
                writer.beginObject()
                writer.key("grants")
                writer.beginArray()
                for grant in holding.grants { writer.string(grant) }
                writer.endArray()
                writer.key("access")
                writer.beginObject()
                for (rule, active) in holding.access.sorted(by: { $0.key < $1.key }) {
                    writer.key(dynamic: rule)
                    writer.bool(active)
                }
                writer.endObject()
                writer.endObject()
            }
        }
        writer.endObject()
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    public func table() -> String {
        var lines = [
            "Production against the replay \(prefix).*: \(compared) users compared, \(differences.count) differ"
        ]
        for difference in differences {
            lines.append("")
            lines.append("user \(difference.user)")
            lines.append("  production: \(difference.production.summary)")
            lines.append("  replay:     \(difference.shadow.summary)")
        }
        return lines.joined(separator: "\n")
    }

    public func html() -> String {
        var page = HTMLReport(title: "encore-processor: production against the replay \(prefix).*")
        page.paragraph(
            "\(compared) users compared, \(differences.count) differ.", className: differences.isEmpty ? "good" : "bad")
        page.table(
            [["user", "production", "replay"]]
                + differences.map { [$0.user, $0.production.summary, $0.shadow.summary] }, id: "differences")
        return page.html()
    }
}
