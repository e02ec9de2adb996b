import Foundation
import EncoreEvents
import EncoreProcessor

/// Generates realistic purchase requests: skewed users, a weighted product mix, placements and
/// offer payloads, plus chosen shares of duplicates and invalid records. Deterministic per seed.
public struct RequestGenerator: Sendable {
    public struct Product: Sendable, Hashable {
        public var id: String
        public var weight: Double
        public init(id: String, weight: Double) {
            self.id = id
            self.weight = weight
        }
    }

    public struct Options: Sendable {
        public var appID = "app_demo"
        public var users = 1000
        /// Zipf exponent of the choice of user; 0 is uniform.
        public var skew = 0.0
        /// Product ids with weights; prefixes (`rc_`, `sk_`, `promo_`) exercise routing.
        public var products = RequestGenerator.defaultProducts
        /// Share of records that repeat an earlier request (same request id).
        public var duplicateRatio = 0.0
        /// Share of records that are invalid, cycling through every ``InvalidKind``.
        public var invalidRatio = 0.0
        public var seed: UInt64 = 1
        /// The requests' environment; `nil`: one in ten `SANDBOX`, the others `PRODUCTION`.
        public var environment: PurchaseEnvironment? = .sandbox
        /// Request ids are `{prefix}-{seed}-{n}`: a load test's own prefix tells its requests apart.
        public var requestIDPrefix = "req"
        /// Attributes every request carries (e.g. `encore_loadtest_run`).
        public var attributes: [String: String] = [:]
        public init() {}
    }

    /// The kinds of invalid records generated, each a different dead-letter reason.
    public enum InvalidKind: String, Sendable, CaseIterable {
        case notJSON = "not_json"
        case notUTF8 = "not_utf8"
        case missingField = "missing_field"
        case wrongType = "wrong_type"
        case unknownEnum = "unknown_enum_value"
        case emptyID = "empty_value"
        case tooLong = "too_long"
        case notAnObject = "not_an_object"

        /// The validation code the processor reports for this kind.
        public var expectedCode: EventValidationError.Code {
            switch self {
            case .notJSON: .notJSON
            case .notUTF8: .notUTF8
            case .missingField: .missingField
            case .wrongType, .notAnObject: .wrongType
            case .unknownEnum: .unknownEnumValue
            case .emptyID: .emptyValue
            case .tooLong: .tooLong
            }
        }
    }

    public enum Kind: Sendable, Hashable {
        case valid
        case duplicate
        case invalid(InvalidKind)
    }

    /// One generated record.
    public struct Record: Sendable {
        public var key: [UInt8]
        public var value: [UInt8]
        public var kind: Kind
        /// The request id, for valid records and duplicates.
        public var requestID: String?
        /// The `requested_at_ms` written into the record.
        public var requestedAtMs: Int64 = 0
    }

    public static let defaultProducts = [
        Product(id: "rc_pro_monthly", weight: 40), Product(id: "rc_pro_yearly", weight: 20),
        Product(id: "sk_lifetime", weight: 15), Product(id: "promo_winback_50", weight: 15),
        Product(id: "com.app.credits_100", weight: 10),
    ]

    private static let placements = ["onboarding_end", "paywall_main", "cancel_flow", "settings_upgrade", nil]

    public let options: Options
    private var random: SplitMix64
    private let userCumulative: [Double]
    private let productCumulative: [Double]
    private var sequence = 0
    private var invalidCount = 0
    private var recent: [PurchaseRequestEvent] = []

    public init(options: Options) {
        precondition(options.users >= 1 && !options.products.isEmpty)
        self.options = options
        random = SplitMix64(seed: options.seed)
        userCumulative =
            options.skew > 0 ? Self.cumulative((1...options.users).map { 1 / pow(Double($0), options.skew) }) : []
        productCumulative = Self.cumulative(options.products.map(\.weight))
    }

    private static func cumulative(_ weights: [Double]) -> [Double] {
        var total = 0.0
        let sums = weights.map { weight in
            total += weight
            return total
        }
        return sums.map { $0 / total }
    }

    private static func pick(_ cumulative: [Double], _ unit: Double) -> Int {
        var low = 0
        var high = cumulative.count - 1
        while low < high {
            let middle = (low + high) / 2
            if cumulative[middle] < unit { low = middle + 1 } else { high = middle }
        }
        return low
    }

    /// The next record; `nowMs` becomes its `requested_at_ms`.
    public mutating func next(nowMs: Int64) -> Record {
        sequence += 1
        let roll = random.nextUnit()
        if roll < options.invalidRatio {
            let kind = InvalidKind.allCases[invalidCount % InvalidKind.allCases.count]
            invalidCount += 1
            let request = makeRequest(nowMs: nowMs)
            return Record(
                key: Array(request.key.utf8), value: Self.invalidValue(kind, request), kind: .invalid(kind),
                requestedAtMs: nowMs)
        }
        if roll < options.invalidRatio + options.duplicateRatio, !recent.isEmpty {
            let original = recent[Int(random.next() % UInt64(recent.count))]
            return Record(
                key: Array(original.key.utf8), value: original.jsonBytes(), kind: .duplicate,
                requestID: original.requestID, requestedAtMs: original.requestedAtMs)
        }
        let request = makeRequest(nowMs: nowMs)
        if options.duplicateRatio > 0 {
            if recent.count < 1024 { recent.append(request) } else { recent[sequence % 1024] = request }
        }
        return Record(
            key: Array(request.key.utf8), value: request.jsonBytes(), kind: .valid, requestID: request.requestID,
            requestedAtMs: nowMs)
    }

    /// The grants offers carry; each product's offer is one of them.
    static let offers: [Entitlement] = [
        Entitlement(type: .freeTrial, value: 7, unit: .days), Entitlement(type: .freeTrial, value: 14, unit: .days),
        Entitlement(type: .freeTrial, value: 1, unit: .months), Entitlement(type: .discount, value: 20, unit: .percent),
        Entitlement(type: .discount, value: 50, unit: .percent), Entitlement(type: .credit, value: 5, unit: .dollars),
    ]

    private mutating func makeRequest(nowMs: Int64) -> PurchaseRequestEvent {
        let user =
            options.skew > 0
            ? Self.pick(userCumulative, random.nextUnit()) : Int(random.next() % UInt64(options.users))
        let product = options.products[Self.pick(productCumulative, random.nextUnit())].id
        let placement = Self.placements[Int(random.next() % UInt64(Self.placements.count))]
        // Three in four requests come from an offer; an offer grants what its product stands for.
        let entitlement: Entitlement? =
            random.next() % 4 == 3 ? nil : Self.offers[Int(fnv1a(product) % UInt64(Self.offers.count))]
        return PurchaseRequestEvent(
            requestID: "\(options.requestIDPrefix)-\(options.seed)-\(sequence)", appID: options.appID,
            appUserID: "user-\(String(user, radix: 10))", productID: product,
            store: [.appStore, .appStore, .playStore, .stripe][Int(random.next() % 4)],
            environment: Self.environment(options.environment, draw: random.next()),
            requestedAtMs: nowMs,
            placementID: placement, campaignID: entitlement == nil ? nil : "cmp-\(random.next() % 8)",
            offerID: entitlement == nil ? nil : "offer-\(random.next() % 16)", entitlement: entitlement,
            attributes: options.attributes.isEmpty ? nil : options.attributes)
    }

    /// The configured environment, or one in ten `SANDBOX` by `draw` (drawn either way, so a seed
    /// gives the same other fields whatever the environment).
    static func environment(_ configured: PurchaseEnvironment?, draw: UInt64) -> PurchaseEnvironment {
        configured ?? (draw % 10 == 0 ? .sandbox : .production)
    }

    static func invalidValue(_ kind: InvalidKind, _ request: PurchaseRequestEvent) -> [UInt8] {
        var valid = request
        switch kind {
        case .notJSON:
            return Array(request.jsonBytes().dropLast(7))
        case .notUTF8:
            return Array("{\"request_id\":\"".utf8) + [0xFF, 0xFE, 0x80] + Array("\"}".utf8)
        case .missingField:
            let text = String(decoding: request.jsonBytes(), as: UTF8.self)
            return Array(text.replacingOccurrences(of: "\"product_id\":", with: "\"product\":").utf8)
        case .wrongType:
            let text = String(decoding: request.jsonBytes(), as: UTF8.self)
            return Array(
                text.replacingOccurrences(
                    of: "\"requested_at_ms\":\(request.requestedAtMs)", with: "\"requested_at_ms\":\"yesterday\""
                ).utf8)
        case .unknownEnum:
            let text = String(decoding: request.jsonBytes(), as: UTF8.self)
            return Array(
                text.replacingOccurrences(
                    of: "\"store\":\"\(request.store.rawValue)\"", with: "\"store\":\"WINDOWS_STORE\""
                ).utf8)
        case .emptyID:
            valid.requestID = ""
            return valid.jsonBytes()
        case .tooLong:
            valid.productID = String(repeating: "x", count: EventLimits.identifierLength + 1)
            return valid.jsonBytes()
        case .notAnObject:
            return Array("[\"\(request.requestID)\"]".utf8)
        }
    }
}
