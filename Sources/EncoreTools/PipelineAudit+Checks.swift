import EncoreEvents

extension PipelineAudit {
    /// The report, once every topic has been read: the checks that need everything.
    public func finish() -> AuditReport {
        var report = self.report
        report.figures.requests = requests.count
        report.figures.resentRequests = resentRequests
        report.figures.inDoubtOpen = requests.count { $0.inDoubt } - report.figures.inDoubtExpired
        for (index, place) in invalid.enumerated() {
            report.add(.invalidRequests, AuditReport.Example(requestID: invalidIDs[index], at: place))
            if !deadLettered.contains(place) {
                report.add(.undeadInvalid, AuditReport.Example(requestID: invalidIDs[index], at: place))
            }
        }
        checkOutcomes(&report)
        for user in users { check(user, &report) }
        return report
    }

    /// Missing outcomes, and outcomes out of the order of their users' requests.
    private func checkOutcomes(_ report: inout AuditReport) {
        let requestsTopic = topicNames[.requests]!
        var answered: [Int] = []
        let outcomesFrom = outcomesHeldFrom
        report.figures.outcomesHeldFromMs = outcomesFrom
        for (index, request) in requests.enumerated() {
            // (An outcome older than what retention left of the outcomes topic may be gone.)
            if request.outcome == nil && request.timestampMs >= outcomesFrom ?? .min {
                report.add(
                    .missingOutcomes,
                    AuditReport.Example(
                        requestID: requestID(of: request), user: users[Int(request.user)].key,
                        at: Coordinates(topic: requestsTopic, partition: request.partition, offset: request.offset)))
            } else if request.outcome != nil {
                answered.append(index)
            }
        }
        // Each user's first outcomes in the order they were published; their requests' positions
        // must rise with them.
        answered.sort {
            let (a, b) = (requests[$0], requests[$1])
            return (a.user, a.outcomePartition, a.outcomeOffset) < (b.user, b.outcomePartition, b.outcomeOffset)
        }
        var latest: (user: Int32, partition: Int32, offset: Int64)? = nil
        for index in answered {
            let request = requests[index]
            if let seen = latest, seen.user == request.user,
                (request.partition, request.offset) < (seen.partition, seen.offset)
            {
                report.add(
                    .orderViolations,
                    AuditReport.Example(
                        requestID: requestID(of: request), user: users[Int(request.user)].key,
                        at: Coordinates(
                            topic: topicNames[.outcomes]!, partition: request.outcomePartition,
                            offset: request.outcomeOffset),
                        detail:
                            "its request \(requestsTopic)[\(request.partition)]@\(request.offset) precedes one answered earlier, at [\(seen.partition)]@\(seen.offset)"
                    ))
                continue
            }
            latest = (request.user, request.partition, request.offset)
        }
    }

    /// A grant as the user's changes leave it.
    private struct DerivedGrant: Equatable {
        var entitlement: Entitlement?
        var status: EntitlementStatus?
        var isActive: Bool
    }

    /// Sequence gaps and repeats, unexplained changes, and the changelog against the changes.
    private func check(_ user: UserFacts, _ report: inout AuditReport) {
        guard !user.changes.isEmpty else { return }
        let changesTopic = topicNames[.changes]!
        let changes = user.changes.sorted { ($0.sequence, $0.offset) < ($1.sequence, $1.offset) }
        // The whole history is in the topic when its partition was read from offset 0.
        let whole = changePartitionsFromStart.contains(changes[0].partition)
        var previous: Int64? = whole ? 0 : nil
        var grants: [UInt64: DerivedGrant] = [:]
        var products: [UInt64: UInt64] = [:]
        var access: [String: Bool] = [:]
        var sawGrant = false
        for change in changes {
            let example = { (detail: String) in
                AuditReport.Example(
                    requestID: change.requestID, user: user.key,
                    at: Coordinates(topic: changesTopic, partition: change.partition, offset: change.offset),
                    detail: detail)
            }
            if let previous, change.sequence == previous {
                report.add(.sequenceRepeats, example("sequence \(change.sequence) again"))
                continue
            }
            if let previous, change.sequence > previous + 1 {
                report.add(.sequenceGaps, example("sequence \(change.sequence) follows \(previous)"))
            }
            previous = change.sequence
            let outcome = outcome(of: change, user)
            if let rule = change.access {
                let explained =
                    sawGrant || user.hasSourceEvents || (!readsSources && change.namesSources) || !whole
                if !explained {
                    report.add(
                        .unexplainedChanges, example("access '\(rule)' \(change.kind.rawValue) with no grant or source")
                    )
                }
                access[rule] = change.isActive
                continue
            }
            sawGrant = true
            guard let request = change.request else {
                report.add(.unexplainedChanges, example("a grant change names no request"))
                continue
            }
            switch change.kind {
            case .granted, .verified:
                let causes = outcome?.result == .purchased || (outcome?.result == .pending && change.kind == .granted)
                if !causes {
                    let answer = outcome.map { "its outcome is \($0.result.rawValue)" } ?? "no outcome"
                    report.add(.unexplainedChanges, example("\(change.kind.rawValue), but \(answer)"))
                }
                if let product = outcome?.product {
                    // One grant per product: a new grant of the product replaces the earlier one.
                    for (other, otherProduct) in products where otherProduct == product && other != request {
                        grants[other] = nil
                        products[other] = nil
                    }
                    products[request] = product
                }
            case .expired, .revoked:
                // (Without the whole history, the grant may be older than what the topic holds.)
                if grants[request] == nil && whole {
                    report.add(.unexplainedChanges, example("\(change.kind.rawValue) a grant never granted"))
                }
            }
            grants[request] = DerivedGrant(
                entitlement: change.entitlement, status: change.status ?? grants[request]?.status,
                isActive: change.isActive)
        }
        compareState(
            user, sequence: previous ?? changes.last!.sequence, grants: whole ? grants : nil,
            access: whole ? access : nil, &report)
    }

    /// The user's latest changelog record against what the changes add up to (`grants` and `access`
    /// only when the whole history was read).
    private func compareState(
        _ user: UserFacts, sequence: Int64, grants: [UInt64: DerivedGrant]?, access: [String: Bool]?,
        _ report: inout AuditReport
    ) {
        let stateTopic = topicNames[.state]!
        guard let bytes = user.latestState, let at = user.latestStateAt else {
            report.add(
                .stateMismatches,
                AuditReport.Example(
                    requestID: nil, user: user.key,
                    at: Coordinates(topic: stateTopic, partition: user.changes[0].partition, offset: -1),
                    detail: "no changelog record, but changes up to sequence \(sequence)"))
            return
        }
        func mismatch(_ detail: String) {
            report.add(.stateMismatches, AuditReport.Example(requestID: nil, user: user.key, at: at, detail: detail))
        }
        guard let state = try? EntitlementStateRecord(jsonBytes: bytes) else {
            mismatch("the latest changelog record is not a valid state record")
            return
        }
        // Written after the changes were read (a live pipeline): newer than what they add up to.
        if state.sequence > sequence && state.updatedAtMs >= changesReadFrom { return }
        if state.sequence != sequence {
            mismatch("changelog at sequence \(state.sequence), changes reach \(sequence)")
            return
        }
        if let grants {
            var held: [UInt64: DerivedGrant] = [:]
            for grant in state.grants {
                held[Self.fingerprint(grant.requestID)] = DerivedGrant(
                    entitlement: grant.entitlement, status: grant.status, isActive: grant.isActive)
            }
            if held != grants {
                let differing = state.grants.first {
                    grants[Self.fingerprint($0.requestID)]
                        != DerivedGrant(entitlement: $0.entitlement, status: $0.status, isActive: $0.isActive)
                }
                mismatch(
                    differing.map { "the grant of request \($0.requestID) is not what the changes say" }
                        ?? "the changes grant what the changelog does not hold")
                return
            }
        }
        if let access {
            // A rule the catalog no longer has is forgotten without a change: only the rules the
            // record holds are compared.
            for rule in state.access.keys.sorted() where state.access[rule] != (access[rule] ?? false) {
                let active = state.access[rule] ?? false
                mismatch("access '\(rule)' is \(active ? "active" : "inactive"), the changes say otherwise")
                return
            }
        }
    }
}
