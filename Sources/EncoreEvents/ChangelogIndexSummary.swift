/// What the state store's indexes need of a changelog record (docs/STATE.md, Format), read in one
/// pass over its JSON without decoding it: whether it holds an open request (journaled, no result
/// yet) and, for a user's state, the earliest expiry among its active grants and sources (a
/// source's only when past the state's `updated_at_ms`, as the ledger counts them). A restore that
/// rebuilds a store reads millions of records only for these; a full decode was a quarter of its CPU.
///
/// `nil` for bytes that are not JSON of the expected shape (an object; a number that is not a plain
/// integer where an expiry is read; a field it reads given twice, which the decoder resolves as the
/// last one): the caller then decodes the record. Other fields are skipped unread, so a record the
/// decoder would refuse may still get a summary (the store is a cache; the restore that reads the
/// user's records back decides). The expiry rule is `EntitlementLedger.earliestExpiry(of:after:)`'s
/// with no floor (EncoreProcessor), kept equal by `ChangelogIndexSummaryTests`.
public struct ChangelogIndexSummary: Sendable, Equatable {
    public var hasOpenRequest: Bool
    public var earliestExpiryMs: Int64?

    public init(hasOpenRequest: Bool, earliestExpiryMs: Int64? = nil) {
        self.hasOpenRequest = hasOpenRequest
        self.earliestExpiryMs = earliestExpiryMs
    }

    /// A ``JournalRecord``'s: open while its `result` is absent (or `null`).
    public static func journal(_ bytes: UnsafeBufferPointer<UInt8>) -> Self? {
        var scanner = JSONScanner(bytes)
        guard let result = hasResult(&scanner), scanner.atEnd() else { return nil }
        return Self(hasOpenRequest: !result)
    }

    /// Reads an object: whether its `result` is there and not `null` (`nil`: not read).
    private static func hasResult(_ scanner: inout JSONScanner) -> Bool? {
        var result: Bool? = nil
        let read = scanner.object { scanner, name in
            guard equals(name, "result") else { return scanner.skipValue() }
            guard result == nil else { return false }
            result = !scanner.null()
            return result == false || scanner.skipValue()
        }
        return read ? result ?? false : nil
    }

    /// An ``EntitlementStateRecord``'s: open when an entry of its `requests` (an earlier version's
    /// journal) has no result; its earliest expiry.
    public static func state(_ bytes: UnsafeBufferPointer<UInt8>) -> Self? {
        var scanner = JSONScanner(bytes)
        var open = false
        var updatedAtMs: Int64 = 0
        var grantExpiry: Int64? = nil
        var sourceExpiries: [Int64] = []
        var seen = 0
        let read = scanner.object { scanner, name in
            if let index = stateFields.firstIndex(where: { equals(name, $0) }) {
                guard seen & (1 << index) == 0 else { return false }
                seen |= 1 << index
            }
            if equals(name, "updated_at_ms") {
                guard let value = scanner.integer() else { return false }
                updatedAtMs = value
                return true
            } else if equals(name, "grants") || equals(name, "sources") {
                let isGrant = equals(name, "grants")
                if scanner.null() { return true }
                return scanner.array { scanner in
                    guard let (active, expiry) = activeExpiry(&scanner) else { return false }
                    if active, let expiry {
                        if isGrant {
                            grantExpiry = min(grantExpiry ?? expiry, expiry)
                        } else {
                            sourceExpiries.append(expiry)
                        }
                    }
                    return true
                }
            } else if equals(name, "requests") {
                if scanner.null() { return true }
                return scanner.array { scanner in
                    guard let result = hasResult(&scanner) else { return false }
                    if !result { open = true }
                    return true
                }
            }
            return scanner.skipValue()
        }
        guard read, scanner.atEnd() else { return nil }
        var earliest = grantExpiry
        for expiry in sourceExpiries where expiry > updatedAtMs { earliest = min(earliest ?? expiry, expiry) }
        return Self(hasOpenRequest: open, earliestExpiryMs: earliest)
    }

    /// The state's fields the summary reads (each at most once).
    private static let stateFields: [StaticString] = ["updated_at_ms", "grants", "sources", "requests"]

    /// A grant's or source's `is_active` (absent: not active) and `expires_at_ms`.
    private static func activeExpiry(_ scanner: inout JSONScanner) -> (Bool, Int64?)? {
        var active: Bool? = nil
        var expiry: Int64?? = nil
        let read = scanner.object { scanner, name in
            if equals(name, "is_active") {
                guard active == nil, let value = scanner.bool() else { return false }
                active = value
                return true
            } else if equals(name, "expires_at_ms") {
                guard expiry == nil else { return false }
                if scanner.null() {
                    expiry = .some(nil)
                    return true
                }
                guard let value = scanner.integer() else { return false }
                expiry = value
                return true
            }
            return scanner.skipValue()
        }
        return read ? (active ?? false, expiry ?? nil) : nil
    }

    private static func equals(_ name: UnsafeBufferPointer<UInt8>, _ expected: StaticString) -> Bool {
        name.count == expected.utf8CodeUnitCount
            && name.elementsEqual(UnsafeBufferPointer(start: expected.utf8Start, count: expected.utf8CodeUnitCount))
    }
}
