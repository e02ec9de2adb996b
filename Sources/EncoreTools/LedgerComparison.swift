import EncoreEvents

/// The users whose grants or access answers differ between production's ledger and a replay's
/// (`audit --compare PREFIX`). Only what the replayed requests granted is compared (production's
/// grants of other requests are left out); access answers only where every production grant came
/// from a replayed request and no other source reports on the user. Times are left out.
public struct LedgerComparison: Sendable {
    /// What a user holds, as compared.
    public struct Holding: Sendable, Hashable {
        /// `product: type value unit status active|inactive`, sorted.
        public var grants: [String]
        /// `nil`: not compared.
        public var access: [String: Bool]?

        init(_ grants: [EntitlementStateRecord.Grant], access: [String: Bool]?) {
            self.access = access
            self.grants = grants.map { grant in
                let entitlement = grant.entitlement
                let value =
                    entitlement.value == entitlement.value.rounded()
                    ? String(Int64(entitlement.value)) : String(entitlement.value)
                return
                    "\(grant.productID): \(entitlement.type.rawValue) \(value) \(entitlement.unit.rawValue) \(grant.status.rawValue) \(grant.isActive ? "active" : "inactive")"
            }.sorted()
        }

        var summary: String {
            let rules = (access ?? [:]).sorted { $0.key < $1.key }.map {
                "\($0.key)=\($0.value ? "active" : "inactive")"
            }
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

    /// Users whose access answers were not compared (grants of other requests, or other sources).
    public let accessNotCompared: Int

    /// Compares each user of `shadow` with the same user in `production` (latest changelog
    /// records); `replayed`: the request ids the replay processed.
    public init(
        prefix: String, production: [String: EntitlementStateRecord], shadow: [String: EntitlementStateRecord],
        replayed: Set<String>
    ) {
        self.prefix = prefix
        compared = shadow.count
        var skipped = 0
        differences = shadow.keys.sorted().compactMap { user in
            let state = shadow[user]!
            let held = production[user]
            let grants = (held?.grants ?? []).filter { replayed.contains($0.requestID) }
            let whole = grants.count == (held?.grants.count ?? 0) && (held?.sources.isEmpty ?? true)
            if !whole { skipped += 1 }
            let replay = Holding(state.grants, access: whole ? state.access : nil)
            let production = Holding(grants, access: whole ? held?.access ?? [:] : nil)
            return replay == production ? nil : Difference(user: user, production: production, shadow: replay)
        }
        accessNotCompared = skipped
    }

    public func json() -> String {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("compare", prefix)
        writer.field("compared_users", compared)
        writer.field("differing_users", differences.count)
        writer.field("access_not_compared", accessNotCompared)
        writer.objects("differences", differences) { writer, difference in
            writer.field("user", difference.user)
            for (name, holding) in [("production", difference.production), ("shadow", difference.shadow)] {
                writer.key(dynamic: name)
                writer.beginObject()
                writer.field("grants", holding.grants)
                if let access = holding.access {
                    writer.key("access")
                    writer.beginObject()
                    for (rule, active) in access.sorted(by: { $0.key < $1.key }) {
                        writer.key(dynamic: rule)
                        writer.bool(active)
                    }
                    writer.endObject()
                }
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
        if accessNotCompared > 0 {
            lines.append(
                "(access answers not compared for \(accessNotCompared) users: production holds grants of requests outside the replay, or other sources)"
            )
        }
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
