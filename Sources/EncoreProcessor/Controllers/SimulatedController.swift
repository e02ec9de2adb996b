import Foundation

/// A stand-in store for demos and load tests: answers after a jittered latency with outcomes drawn
/// from configured shares, deterministically for a given seed and request id.
public struct SimulatedController: PurchaseController {
    /// What the simulated store can answer, with relative weights.
    public enum Answer: String, Sendable, CaseIterable {
        case purchased, cancelled, pending
        /// Throws a retryable ``PurchaseControllerError`` (a store outage).
        case retryableError = "retryable-error"
        /// Throws a final ``PurchaseControllerError``.
        case error
    }

    public let meanLatency: Duration
    public let weights: [(answer: Answer, weight: Double)]
    public let seed: UInt64
    /// Whether `PRODUCTION` requests are answered; otherwise they fail with
    /// ``refusedProductionType`` (a dead letter), since no real purchase is made.
    public let allowsProduction: Bool
    /// Fault injection: a request with attribute `simulated_stall_ms` blocks the calling thread
    /// that long before the answer, as a controller that never suspends would (the dispatch loop
    /// stalls: what `/healthz` must notice). Off unless asked for.
    public let honoursStalls: Bool

    /// The error type of a refused `PRODUCTION` request.
    public static let refusedProductionType = "simulated_refuses_production"

    /// - Parameters:
    ///   - meanLatency: mean of a latency drawn uniformly from 0.5× to 1.5× of it; zero answers at once.
    ///   - weights: relative shares of each answer; at least one positive.
    ///   - allowsProduction: answer `PRODUCTION` requests too (load tests on production-shaped data).
    public init(
        meanLatency: Duration = .zero, weights: [(answer: Answer, weight: Double)], seed: UInt64 = 1,
        allowsProduction: Bool = false, honoursStalls: Bool = false
    ) {
        self.meanLatency = meanLatency
        self.weights = weights.filter { $0.weight > 0 }
        self.seed = seed
        self.allowsProduction = allowsProduction
        self.honoursStalls = honoursStalls
        precondition(!self.weights.isEmpty, "a simulated controller needs at least one positive weight")
    }

    /// Parses `purchased=0.8,cancelled=0.15,pending=0.05` (also `retryable-error=`, `error=`).
    public static func parseWeights(_ text: String) -> Result<[(answer: Answer, weight: Double)], ParseError> {
        var weights: [(answer: Answer, weight: Double)] = []
        for part in text.split(separator: ",") {
            let pieces = part.split(separator: "=", maxSplits: 1)
            guard pieces.count == 2, let answer = Answer(rawValue: pieces[0].trimmingCharacters(in: .whitespaces))
            else {
                let names = Answer.allCases.map(\.rawValue).joined(separator: ", ")
                return .failure(ParseError(message: "'\(part)' is not NAME=WEIGHT with NAME one of \(names)"))
            }
            guard let weight = Double(pieces[1].trimmingCharacters(in: .whitespaces)), weight >= 0, weight.isFinite
            else {
                return .failure(ParseError(message: "weight of '\(answer.rawValue)' must be a non-negative number"))
            }
            weights.append((answer, weight))
        }
        guard weights.contains(where: { $0.weight > 0 }) else {
            return .failure(ParseError(message: "at least one weight must be positive"))
        }
        return .success(weights)
    }

    public struct ParseError: Error, Sendable {
        public let message: String
    }

    /// Answers like a store with an idempotency key: a recovery call first looks up what the
    /// earlier attempts of the request answered, and returns the first definite answer among them
    /// (the purchase is not made twice); otherwise it draws a new one.
    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        if honoursStalls, let stall = request.event.attributes?["simulated_stall_ms"].flatMap({ UInt32($0) }) {
            usleep(min(stall, 60_000) * 1000)
        }
        let (latencyUnit, answer) = try decide(request)
        if meanLatency > .zero {
            // One shared timer thread rather than a dispatch timer per call (see SimulatedDelays).
            try await SimulatedDelays.shared.sleep(for: meanLatency * (0.5 + latencyUnit))
        }
        return try Self.result(of: answer)
    }

    /// With no latency (and no stalls to honour), the answer is known at once: no task is made.
    public func immediateAnswer(to request: PurchaseRequest) -> Result<PurchaseResult, any Error>? {
        guard meanLatency == .zero, !honoursStalls else { return nil }
        return Result { try Self.result(of: decide(request).answer) }
    }

    /// The latency unit and the answer for `request`; throws for a `PRODUCTION` request it refuses.
    private func decide(_ request: PurchaseRequest) throws -> (latencyUnit: Double, answer: Answer) {
        if request.event.environment == .production && !allowsProduction {
            throw PurchaseControllerError.final(
                Self.refusedProductionType,
                "the simulated controller makes no real purchase, so it does not answer PRODUCTION requests (--allow-simulated-production for load tests)"
            )
        }
        let (latencyUnit, drawn) = draw(request.requestId, attempt: request.attempt)
        var answer = drawn
        if request.isRecovery {
            for earlier in 1..<max(1, request.attempt) {
                let (_, earlierAnswer) = draw(request.requestId, attempt: earlier)
                if [.purchased, .cancelled, .pending].contains(earlierAnswer) {
                    answer = earlierAnswer
                    break
                }
            }
        }
        return (latencyUnit, answer)
    }

    private static func result(of answer: Answer) throws -> PurchaseResult {
        switch answer {
        case .purchased: return .purchased
        case .cancelled: return .cancelled
        case .pending: return .pending
        case .retryableError: throw PurchaseControllerError.retryable("store_unavailable", "simulated store outage")
        case .error: throw PurchaseControllerError.final("store_declined", "simulated store declined the purchase")
        }
    }

    /// The latency unit and the answer attempt `attempt` of `requestID` draws.
    private func draw(_ requestID: String, attempt: Int) -> (latencyUnit: Double, answer: Answer) {
        var generator = SplitMix64(seed: seed ^ fnv1a(requestID) ^ UInt64(attempt) &* 0x9E37_79B9)
        let latencyUnit = generator.nextUnit()
        let answerUnit = generator.nextUnit()
        let total = weights.reduce(0) { $0 + $1.weight }
        var threshold = answerUnit * total
        for entry in weights {
            if threshold < entry.weight { return (latencyUnit, entry.answer) }
            threshold -= entry.weight
        }
        return (latencyUnit, weights[weights.count - 1].answer)
    }
}

/// A small, fast, seedable generator (Steele et al.'s SplitMix64).
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A uniform value in [0, 1).
    public mutating func nextUnit() -> Double { Double(next() >> 11) * 0x1.0p-53 }
}

/// FNV-1a of a string's UTF-8 bytes: a stable hash (Swift's `Hasher` is seeded per process).
public func fnv1a(_ text: String) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in text.utf8 {
        hash ^= UInt64(byte)
        hash &*= 0x100_0000_01b3
    }
    return hash
}
