import EncoreEvents
import EncoreProcessor

/// What an audit found: a count and up to ``examplesPerDiscrepancy`` examples per discrepancy, and
/// the figures of the range (requests, outcomes, dead letters, changes, latency).
public struct AuditReport: Sendable {
    /// A broken promise, named as in `--json`.
    public enum Discrepancy: String, Sendable, CaseIterable {
        /// Valid requests without an outcome.
        case missingOutcomes = "missing_outcomes"
        /// Records of the requests topic that are not valid requests (a figure: they are the
        /// producer's mistake; the pipeline's duty is their dead letter, see `undeadInvalid`).
        case invalidRequests = "invalid_requests"
        /// Invalid requests without a dead letter.
        case undeadInvalid = "undead_invalid"
        /// Outcomes repeating the result of an earlier outcome of the same request (a request's
        /// `pending` with `outcome_unknown` followed by its one final outcome is not one).
        case duplicateOutcomes = "duplicate_outcomes"
        /// Outcomes whose result differs from an earlier outcome of the same request: a final
        /// after a final, or anything after a final but the in-doubt request's one final.
        case conflictingOutcomes = "conflicting_outcomes"
        /// Outcomes (completed in the range) whose request is not in the requests topic.
        case orphanOutcomes = "orphan_outcomes"
        /// Outcomes published before the outcome of one of the user's earlier requests.
        case orderViolations = "order_violations"
        /// Entitlement changes that no outcome or source event causes.
        case unexplainedChanges = "unexplained_changes"
        /// Places where a user's change sequence skips numbers.
        case sequenceGaps = "sequence_gaps"
        /// Changes whose sequence number the user already used.
        case sequenceRepeats = "sequence_repeats"
        /// Users whose latest changelog record is not what their changes add up to.
        case stateMismatches = "state_mismatches"

        /// Whether it breaks a promise of the pipeline (every one but `invalid_requests`).
        public var isFailure: Bool { self != .invalidRequests }
    }

    /// One instance of a discrepancy: the request (or user) and where the record at fault is.
    public struct Example: Sendable, Hashable {
        public var requestID: String?
        public var user: String?
        public var at: PipelineAudit.Coordinates
        public var detail: String?

        public init(requestID: String?, user: String? = nil, at: PipelineAudit.Coordinates, detail: String? = nil) {
            self.requestID = requestID
            self.user = user
            self.at = at
            self.detail = detail
        }
    }

    /// What the range holds, besides discrepancies.
    public struct Figures: Sendable {
        public var requests = 0
        public var resentRequests = 0
        /// Requests that went in doubt (a `pending` with `outcome_unknown`), that got their final
        /// outcome since (by its result), that expired (dead letter `in_doubt_expired`), and that
        /// are still in doubt at the end of what was read.
        public var inDoubtOpened = 0
        public var inDoubtResolved = 0
        public var resolvedInDoubtByResult: [String: Int] = [:]
        public var inDoubtExpired = 0
        public var inDoubtOpen = 0
        /// Records reusing a request id with other content (dead letters `request_id_conflict`).
        public var requestIDConflicts = 0
        /// Requests of the range a load test produced (`attributes.encore_loadtest_run`), by run id.
        public var loadTestRequests: [String: Int] = [:]
        public var outcomes = 0
        public var outcomesByResult: [String: Int] = [:]
        public var outcomesByController: [String: Int] = [:]
        public var deadLettersByStage: [String: Int] = [:]
        public var deadLettersByClass: [String: Int] = [:]
        public var changesByKind: [String: Int] = [:]
        /// Set when retention deleted early requests: the time from which every partition holds them.
        public var requestsHeldFromMs: Int64? = nil
        /// Set when retention deleted early outcomes: requests older than this are not called missing.
        public var outcomesHeldFromMs: Int64? = nil
        public var undecodableOutcomes = 0
        public var undecodableChanges = 0
        public var undecodableDeadLetters = 0
        /// Request → outcome: the outcome's `completed_at_ms` less the request record's timestamp.
        public var latencyMs = LatencyHistogram()
        /// Latency counts by power of two: bin 0 is under 1 ms, bin i is [2^(i-1), 2^i) ms.
        public var latencyBins = [Int](repeating: 0, count: 24)
        /// Outcomes (first per request) by minute of completion (epoch minutes) and result.
        public var outcomesPerMinute: [Int64: [OutcomeResult: Int]] = [:]

        mutating func record(_ outcome: PurchaseOutcomeEvent, requestTimestampMs: Int64) {
            outcomes += 1
            outcomesByResult[outcome.result.rawValue, default: 0] += 1
            outcomesByController[outcome.controller ?? "-", default: 0] += 1
            let latency = UInt64(max(0, outcome.completedAtMs - requestTimestampMs))
            latencyMs.record(latency)
            let bin = latency == 0 ? 0 : min(latencyBins.count - 1, 64 - latency.leadingZeroBitCount)
            latencyBins[bin] += 1
            outcomesPerMinute[outcome.completedAtMs / 60_000, default: [:]][outcome.result, default: 0] += 1
        }

        mutating func recordDeadLetter(_ letter: DeadLetterEvent) {
            deadLettersByStage[letter.error.stage.rawValue, default: 0] += 1
            deadLettersByClass[letter.error.errorClass, default: 0] += 1
            switch letter.error.errorClass {
            case "in_doubt_expired": inDoubtExpired += 1
            case "request_id_conflict": requestIDConflicts += 1
            default: break
            }
        }
    }

    /// Examples kept per discrepancy (the HTML report shows them all, `--json` the first
    /// ``examplesInJSON``).
    public static let examplesPerDiscrepancy = 1000
    public static let examplesInJSON = 20

    public let range: PipelineAudit.TimeRange
    public private(set) var counts: [Discrepancy: Int] = [:]
    public private(set) var examples: [Discrepancy: [Example]] = [:]
    public var figures = Figures()

    init(range: PipelineAudit.TimeRange) {
        self.range = range
        for discrepancy in Discrepancy.allCases { counts[discrepancy] = 0 }
    }

    mutating func add(_ discrepancy: Discrepancy, _ example: Example) {
        counts[discrepancy, default: 0] += 1
        if examples[discrepancy, default: []].count < Self.examplesPerDiscrepancy {
            examples[discrepancy, default: []].append(example)
        }
    }

    public func count(_ discrepancy: Discrepancy) -> Int { counts[discrepancy] ?? 0 }

    /// Discrepancies that break a promise (all but `invalid_requests`), and records of the
    /// pipeline's own topics that are not valid events.
    public var failures: Int {
        Discrepancy.allCases.filter(\.isFailure).reduce(0) { $0 + count($1) } + figures.undecodableOutcomes
            + figures.undecodableChanges + figures.undecodableDeadLetters
    }
}
