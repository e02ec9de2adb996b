import EncoreEvents

/// What each product grants, and the access rules that merge grants with other sources.
///
/// Read from the `--catalog` JSON file:
/// ```json
/// {
///   "products": {
///     "com.app.trial_7d": {"type": "freeTrial", "value": 7, "unit": "days"},
///     "rc_discount_*": {"type": "discount", "value": 20, "unit": "percent"}
///   },
///   "access_rules": {"pro": "revenuecat:pro | superwall:active | encore:freeTrial"}
/// }
/// ```
/// A product id matches an exact entry first, then the longest `prefix*` entry.
public struct EntitlementCatalog: Sendable {
    public private(set) var exact: [String: Entitlement] = [:]
    /// Prefix entries, longest first.
    public private(set) var prefixes: [(prefix: String, entitlement: Entitlement)] = []
    public private(set) var accessRules: [AccessRule] = []

    public init() {}

    /// Adds a product entry: `id` for one product, `prefix*` for every product starting with `prefix`.
    public mutating func add(_ pattern: String, grants entitlement: Entitlement) {
        if pattern.hasSuffix("*") {
            prefixes.append((String(pattern.dropLast()), entitlement))
            prefixes.sort { $0.prefix.count > $1.prefix.count }
        } else {
            exact[pattern] = entitlement
        }
    }

    /// Adds an access rule; a rule with the same name is replaced.
    public mutating func add(_ rule: AccessRule) {
        accessRules.removeAll { $0.name == rule.name }
        accessRules.append(rule)
    }

    /// The entitlement `productID` grants, if the catalog has one.
    public func entitlement(for productID: String) -> Entitlement? {
        if let entitlement = exact[productID] { return entitlement }
        return prefixes.first { productID.hasPrefix($0.prefix) }?.entitlement
    }

    /// Parses the catalog file's JSON; the error names the entry at fault.
    public init(jsonBytes: [UInt8]) throws(ProcessorError) {
        func invalid(_ message: String) -> ProcessorError {
            ProcessorError(.invalidConfiguration, "catalog: \(message)")
        }
        let document: JSONValue
        do {
            document = try JSONValue.parse(jsonBytes)
        } catch {
            throw invalid("not valid JSON (\(error))")
        }
        guard case .object(let fields) = document else { throw invalid("expected a JSON object") }
        for key in fields.keys where key != "products" && key != "access_rules" {
            throw invalid("unknown key '\(key)' (expected 'products' and 'access_rules')")
        }
        if let products = fields["products"] {
            guard case .object(let entries) = products else { throw invalid("'products' must be an object") }
            for (pattern, value) in entries.sorted(by: { $0.key < $1.key }) {
                guard !pattern.isEmpty, pattern != "*" else { throw invalid("empty product pattern '\(pattern)'") }
                do {
                    add(pattern, grants: try Entitlement(json: value, path: "products.\(pattern)"))
                } catch {
                    throw invalid(error.description)
                }
            }
        }
        if let rules = fields["access_rules"] {
            guard case .object(let entries) = rules else { throw invalid("'access_rules' must be an object") }
            for (name, value) in entries.sorted(by: { $0.key < $1.key }) {
                guard case .string(let expression) = value else {
                    throw invalid("access rule '\(name)' must be a string like \"revenuecat:pro | encore:freeTrial\"")
                }
                add(try AccessRule.parse("\(name) = \(expression)"))
            }
        }
    }
}

/// A named "has access" answer merged from several sources, like the seed's `EntitlementManager`:
/// `pro = revenuecat:pro | superwall:active | encore:freeTrial`. Active when any term is.
public struct AccessRule: Sendable, Hashable, CustomStringConvertible {
    /// One source of the answer.
    public enum Term: Sendable, Hashable, CustomStringConvertible {
        /// An active Encore grant of the type (`nil`: any type); `verifiedOnly` is Encore's
        /// `verified` scope, otherwise the `all` scope (provisional grants count).
        case encore(EntitlementType?, verifiedOnly: Bool)
        /// The latest state a source reported for one entitlement id (`nil`: any of its entitlements).
        case source(String, entitlementID: String?)

        public var description: String {
            switch self {
            case .encore(let type, let verifiedOnly):
                "encore:\(type?.rawValue ?? "*")\(verifiedOnly ? "@verified" : "")"
            case .source(let name, let id): "\(name):\(id ?? "*")"
            }
        }

        var sourceName: String {
            switch self {
            case .encore: "encore"
            case .source(let name, _): name
            }
        }
    }

    public var name: String
    public var terms: [Term]

    public init(name: String, terms: [Term]) {
        self.name = name
        self.terms = terms
    }

    public var description: String { "\(name) = \(terms.map(\.description).joined(separator: " | "))" }

    /// Parses `NAME = SOURCE:ID | SOURCE:ID ...`. `encore:TYPE` (or `encore:*`) is an Encore grant,
    /// `encore:TYPE@verified` counts only verified grants; `SOURCE:*` is any entitlement of a source.
    public static func parse(_ text: String) throws(ProcessorError) -> AccessRule {
        func invalid(_ message: String) -> ProcessorError {
            ProcessorError(.invalidConfiguration, "access rule '\(text)': \(message)")
        }
        let sides = text.split(separator: "=", maxSplits: 1).map { $0.trimmingSpaces }
        guard sides.count == 2, !sides[0].isEmpty else { throw invalid("expected NAME = SOURCE:ID | ...") }
        let name = sides[0]
        guard name.count <= 64, EntitlementSourceEvent.isValidSourceName(name) else {
            throw invalid("the name may hold only letters, digits, '_', '.' and '-' (at most 64)")
        }
        var terms: [Term] = []
        for part in sides[1].split(separator: "|", omittingEmptySubsequences: false).map({ $0.trimmingSpaces }) {
            let pieces = part.split(separator: ":", maxSplits: 1).map(String.init)
            guard pieces.count == 2, !pieces[0].isEmpty, !pieces[1].isEmpty else {
                throw invalid("term '\(part)' must be SOURCE:ID")
            }
            let (source, id) = (pieces[0], pieces[1])
            if source == "encore" {
                let verifiedOnly = id.hasSuffix("@verified")
                let typeName = verifiedOnly ? String(id.dropLast("@verified".count)) : id
                if typeName == "*" {
                    terms.append(.encore(nil, verifiedOnly: verifiedOnly))
                } else if let type = EntitlementType(rawValue: typeName) {
                    terms.append(.encore(type, verifiedOnly: verifiedOnly))
                } else {
                    let known = EntitlementType.allCases.map(\.rawValue).joined(separator: ", ")
                    throw invalid("unknown Encore entitlement '\(typeName)' (expected one of \(known), *)")
                }
            } else {
                guard EntitlementSourceEvent.isValidSourceName(source) else {
                    throw invalid("source '\(source)' may hold only letters, digits, '_', '.' and '-'")
                }
                terms.append(.source(source, entitlementID: id == "*" ? nil : id))
            }
        }
        return AccessRule(name: name, terms: terms)
    }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
