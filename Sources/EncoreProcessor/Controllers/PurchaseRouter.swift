/// Routes a product id to a named controller: ordered rules, first match wins.
///
/// Mirrors the seed's `productId.hasPrefix("rc_")` routing. A product no rule matches is not
/// attempted (outcome `not_attempted`), so nothing is ever charged by accident.
public struct PurchaseRouter: Sendable {
    /// How a rule matches a product id.
    public enum Match: Sendable, Hashable, CustomStringConvertible {
        case exact(String)
        case prefix(String)
        /// Matches every product: a catch-all, normally last.
        case any

        func matches(_ productID: String) -> Bool {
            switch self {
            case .exact(let id): productID == id
            case .prefix(let prefix): productID.hasPrefix(prefix)
            case .any: true
            }
        }

        public var description: String {
            switch self {
            case .exact(let id): "=\(id)"
            case .prefix(let prefix): "\(prefix)*"
            case .any: "*"
            }
        }
    }

    public struct Rule: Sendable {
        public var match: Match
        public var controllerName: String

        public init(_ match: Match, to controllerName: String) {
            self.match = match
            self.controllerName = controllerName
        }
    }

    public private(set) var rules: [Rule] = []
    private var controllers: [String: any PurchaseController] = [:]
    /// Whether a registered controller replays recorded answers (``ReplayingController``).
    private(set) var hasReplayingController = false

    public init() {}

    /// Registers `controller` under `name`; rules refer to it by that name.
    public mutating func register(_ name: String, _ controller: any PurchaseController) {
        controllers[name] = controller
        if controller is any ReplayingController { hasReplayingController = true }
    }

    /// Appends a rule; earlier rules win.
    public mutating func route(_ match: Match, to name: String) {
        rules.append(Rule(match, to: name))
    }

    /// The names rules refer to that have no registered controller.
    public var unregisteredNames: [String] {
        var seen = Set<String>()
        return rules.map(\.controllerName).filter { controllers[$0] == nil && seen.insert($0).inserted }
    }

    /// The first matching rule's controller, or `nil` when no rule matches.
    public func controller(for productID: String) -> (name: String, controller: any PurchaseController)? {
        for rule in rules where rule.match.matches(productID) {
            if let controller = controllers[rule.controllerName] { return (rule.controllerName, controller) }
        }
        return nil
    }

    /// Parses a `--route` value: `PREFIX=NAME` (prefix match), `=ID=NAME` (exact id) or `*=NAME` (any).
    public static func parseRoute(_ text: String) -> Rule? {
        guard let equals = text.lastIndex(of: "="), equals != text.startIndex else { return nil }
        let pattern = String(text[..<equals])
        let name = String(text[text.index(after: equals)...])
        guard !name.isEmpty else { return nil }
        if pattern == "*" { return Rule(.any, to: name) }
        if pattern.hasPrefix("=") {
            let id = String(pattern.dropFirst())
            return id.isEmpty ? nil : Rule(.exact(id), to: name)
        }
        return Rule(.prefix(pattern), to: name)
    }
}
