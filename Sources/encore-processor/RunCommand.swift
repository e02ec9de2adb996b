import EncoreEvents
import EncoreProcessor
import Foundation
import Kafka

/// `encore-processor run`: the long-running service.
enum RunCommand {
    static let definition = CommandDefinition(
        name: "run",
        summary: "Process purchase requests from Kafka until SIGTERM/SIGINT.",
        usage: "run [options]",
        options: CommonOptions.kafka + CommonOptions.topics + controllerOptions + ledgerOptions + [
            .option("group-id", value: "ID", default: "encore-processor", "Consumer group."),
            .option(
                "instance-id", value: "ID", environment: "ENCORE_INSTANCE_ID",
                "This instance's stable name (default: the host name, a StatefulSet pod's name); exactly-once's transactional.id is <group>-<ID>, so a restart fences its predecessor at once. 'random' draws a new one per start; two live instances must never share one."
            ),
            .flag("embedded-broker", "Start an in-process broker (a trial): without it, brokers are required."),
            .option(
                "http-listen", value: "HOST:PORT",
                "Serve GET /metrics (Prometheus), /healthz and /readyz here (:9464 for every interface)."),
            CommonOptions.partitions,
            .option(
                "state-dir", value: "DIR", default: "./state",
                "The local state store (RocksDB): the changelog cached on disk with checkpoints, so a restart reads only its tail. In DIR/<group-id>; each running instance needs its own. 'none': no store, every assignment reads the changelog from the beginning."
            ),
            .option(
                "state-cache-mb", value: "MB", default: "64",
                "The state store's block cache; with its 32 MB of write buffers, what the store may hold in memory."),
            .option(
                "state-cache-users", value: "N|all", default: "\(ProcessorConfiguration.defaultResidentUsers)",
                "With a state store: at most N users are kept in memory (besides those in flight, not yet written or expiring within a minute); the others are read from the store when their records arrive. all: every user of the owned partitions is in memory (as without a store)."
            ),
            .flag("check", "Validate the arguments and exit (0 when they are valid).", commandLineOnly: true),
        ],
        discussion: """
            Routes: --route rc_=revenuecat sends products starting with rc_ to the controller named
            revenuecat; --route =com.app.pro=billing matches one exact id; --route '*=billing' matches
            everything. First match wins; a product no route matches gets outcome not_attempted.
            Without --route, every product goes to the one configured controller.

            Entitlements: a request's own entitlement, or the --catalog entry of its product, is
            granted on purchased (verified) and pending (provisional). --access-rule
            'pro = revenuecat:pro | superwall:active | encore:freeTrial' publishes a change whenever
            the merged answer flips (sources read from --sources-topic).
            """)

    static let ledgerOptions: [OptionDefinition] = [
        .option(
            "catalog", value: "FILE", environment: "ENCORE_CATALOG",
            "JSON file: what each product (id or prefix*) grants, and access rules."),
        .flag(
            "no-ledger",
            "No entitlement grants nor change events; the changelog still carries the request journal."),
        .option(
            "dedupe-retention", value: "DURATION", default: "7d",
            "How long a request's result stays in the journal: a re-send within it is not called again (s, m, h or d). An open intent stays however old."
        ),
        .option(
            "dedupe-per-user", value: "N", default: "100",
            "Most requests one user's journal holds, at most 1000: a new request takes the slot of the one this many older."
        ),
        .option(
            "guarantee", value: "MODE", default: "at-least-once",
            "at-least-once, or exactly-once (Kafka transactions; readers use isolation.level=read_committed)."),
        .option(
            "access-rule", value: "RULE", repeatable: true,
            "NAME = SOURCE:ID | ... (encore:TYPE, encore:TYPE@verified, SOURCE:*); adds to the catalog's rules."),
    ]

    /// The catalog from `--catalog` and `--access-rule`.
    static func catalog(_ options: ParsedOptions) throws(UsageError) -> EntitlementCatalog {
        var catalog = EntitlementCatalog()
        if let path = options.string("catalog") {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw UsageError("--catalog: cannot read '\(path)'")
            }
            do {
                catalog = try EntitlementCatalog(jsonBytes: Array(data))
            } catch {
                throw UsageError("--catalog: \(path): \(error.message)")
            }
        }
        for text in options.strings("access-rule") {
            do {
                catalog.add(try AccessRule.parse(text))
            } catch {
                throw UsageError("--\(error.message)")
            }
        }
        return catalog
    }

    static let controllerOptions: [OptionDefinition] = [
        .option(
            "controller", value: "KIND", environment: "ENCORE_CONTROLLER",
            "http (your billing service) or simulated (a test store: no real purchase); required."),
        .flag(
            "allow-simulated-production",
            "Let the simulated controller answer PRODUCTION requests (otherwise they are dead letters).",
            commandLineOnly: true),
        .flag(
            "simulated-stalls",
            "Fault injection: a request with attribute simulated_stall_ms=N blocks the simulated store's thread N ms (at most 60 s).",
            commandLineOnly: true),
        .option(
            "controller-url", value: "[NAME=]URL", environment: "ENCORE_CONTROLLER_URL", repeatable: true,
            "Endpoint of an http controller (named NAME, default 'http')."),
        .option(
            "controller-secret-file", value: "FILE",
            "Sign every http call: Encore-Signature t=<unix s>,v1=<hex HMAC-SHA256 of \"<t>.<body>\"> with this file's secret."
        ),
        .option(
            "controller-header", value: "NAME=VALUE", repeatable: true,
            "A header on every http call (VALUE @/path reads a file), e.g. Authorization=@/run/secrets/token."),
        .option("route", value: "PREFIX=NAME", repeatable: true, "Route products to a named controller."),
        .option("max-in-flight", value: "N", default: "256", "Controller calls running at once, across users."),
        .option(
            "workers", value: "N",
            "Dispatch loops in this process; the consumer's partitions are split among them (a user stays on one). Default: the cores available, at most --max-in-flight."
        ),
        .option(
            "buffer-size", value: "N", default: "\(ProcessorConfiguration.defaultBufferCapacity)",
            "Records held (read, not yet done) before the consumer stops reading."),
        .option(
            "call-timeout-ms", value: "MS", default: "30000",
            "Cancel a controller call after this and try it again as a recovery call; its user's next request waits until it returned."
        ),
        .option(
            "max-attempts", value: "N", default: "5",
            "Calls per request when errors are retryable; past them a call whose effect is unknown is in doubt (pending, reconciled)."
        ),
        .option(
            "reconcile-for", value: "DURATION", default: "72h",
            "How long billing is asked again about a request in doubt before it is dead-lettered in_doubt_expired for a person (s, m, h or d)."
        ),
        .option(
            "reconcile-max-interval-ms", value: "MS", default: "300000",
            "The longest wait between two asks about a request in doubt (they back off exponentially from 1 s, with jitter)."
        ),
        .option(
            "clock-skew-margin-ms", value: "MS", default: "5000",
            "At a takeover, an open intent holds its user until its call could no longer run: the intent's time plus the call timeout plus this."
        ),
        .option("retry-backoff-ms", value: "MS", default: "100", "First retry backoff (doubles, jittered, max 10 s)."),
        .option(
            "drain-timeout-ms", value: "MS",
            "Wait for running calls on revoke and shutdown (default: call timeout + 5000; must be longer)."),
        .option("commit-interval-ms", value: "MS", default: "200", "How often finished offsets are committed."),
        .option("simulated-latency-ms", value: "MS", default: "20", "Mean latency of the simulated controller."),
        .option(
            "simulated-outcomes", value: "WEIGHTS", default: "purchased=0.8,cancelled=0.15,pending=0.05",
            "Answer shares of the simulated controller (also retryable-error=, error=)."),
        .option("seed", value: "N", default: "1", "Seed of the simulated controller."),
    ]

    /// Builds the processor configuration and router from parsed options (no I/O); with `router`,
    /// the controller options are not read.
    static func processorSetup(
        _ options: ParsedOptions, kafka: KafkaConfiguration, router given: PurchaseRouter? = nil
    ) throws(UsageError) -> (ProcessorConfiguration, PurchaseRouter) {
        var configuration = ProcessorConfiguration(kafka: kafka)
        let topics = CommonOptions.topicNames(options)
        configuration.requestsTopic = topics[0]
        configuration.outcomesTopic = topics[1]
        configuration.entitlementsTopic = topics[2]
        configuration.deadLetterTopic = topics[3]
        configuration.stateTopic = topics[4]
        configuration.sourcesTopic = options.string("sources-topic")
        configuration.catalog = try catalog(options)
        configuration.ledgerEnabled = !options.flag("no-ledger")
        configuration.groupID = options.string("group-id") ?? configuration.groupID
        configuration.instanceID = options.string("instance-id") ?? configuration.instanceID
        configuration.maxInFlight = try options.integer("max-in-flight", range: 1...1_000_000)
        configuration.bufferCapacity = try options.integer("buffer-size", range: 1...10_000_000)
        configuration.callTimeout = try options.milliseconds("call-timeout-ms", minimum: 1)
        if options.isSet("drain-timeout-ms") {
            configuration.drainTimeout = try options.milliseconds("drain-timeout-ms", minimum: 1)
        }
        configuration.commitInterval = try options.milliseconds("commit-interval-ms", minimum: 1)
        configuration.journal = JournalPolicy(
            retentionMs: try options.duration("dedupe-retention", range: 60_000...(3650 * 86_400_000)),
            perUserCap: try options.integer(
                "dedupe-per-user", range: 1...EntitlementStateRecord.RequestEntry.maximumCount))
        configuration.guarantee = try CommonOptions.guarantee(options)
        configuration.retry = RetryPolicy(
            maxAttempts: try options.integer("max-attempts", range: 1...100),
            initialBackoff: try options.milliseconds("retry-backoff-ms", minimum: 1))
        configuration.reconciliation = ReconcilePolicy(
            duration: .milliseconds(try options.duration("reconcile-for", range: 1000...(3650 * 86_400_000))),
            maxInterval: try options.milliseconds("reconcile-max-interval-ms", minimum: 1),
            clockSkewMargin: try options.milliseconds("clock-skew-margin-ms"))
        configuration.workers =
            options.isSet("workers")
            ? try options.integer("workers", range: 1...64)
            : defaultWorkers(maxInFlight: configuration.maxInFlight)
        do {
            try configuration.validate()
            try configuration.validateClients()
        } catch {
            throw UsageError(error.message.hasPrefix("-X") ? error.message : "--\(error.message)")
        }
        let router: PurchaseRouter
        if let given {
            router = given
        } else {
            router = try makeRouter(
                options, callTimeout: configuration.callTimeout, maxConnections: configuration.maxInFlight)
        }
        return (configuration, router)
    }

    /// One dispatch loop per core available, never more than the calls allowed at once.
    static func defaultWorkers(maxInFlight: Int) -> Int {
        max(1, min(ProcessInfo.processInfo.activeProcessorCount, 64, maxInFlight))
    }

    static func makeRouter(
        _ options: ParsedOptions, callTimeout: Duration, maxConnections: Int
    ) throws(UsageError) -> PurchaseRouter {
        var router = PurchaseRouter()
        var names: [String] = []
        guard options.string("controller") != nil else {
            throw UsageError(
                "--controller is required: http (with --controller-url, your billing service) or simulated (a test store that makes no real purchase)"
            )
        }
        switch try options.choice("controller", ["simulated", "http"]) {
        case "simulated":
            guard options.strings("controller-url").isEmpty else {
                throw UsageError("--controller-url needs --controller http")
            }
            let weights: [(answer: SimulatedController.Answer, weight: Double)]
            switch SimulatedController.parseWeights(options.string("simulated-outcomes")!) {
            case .success(let parsed): weights = parsed
            case .failure(let error): throw UsageError("--simulated-outcomes: \(error.message)")
            }
            let controller = SimulatedController(
                meanLatency: try options.milliseconds("simulated-latency-ms"), weights: weights,
                seed: UInt64(try options.integer("seed", range: 0...Int.max)),
                allowsProduction: options.flag("allow-simulated-production"),
                honoursStalls: options.flag("simulated-stalls"))
            router.register("simulated", controller)
            names = ["simulated"]
        default:
            let urls = options.strings("controller-url")
            guard !urls.isEmpty else { throw UsageError("--controller http needs --controller-url") }
            var headers: [(name: String, value: String)] = []
            for entry in options.strings("controller-header") {
                guard let equals = entry.firstIndex(of: "="), equals != entry.startIndex else {
                    throw UsageError("--controller-header: expected NAME=VALUE (the value is not shown)")
                }
                let name = String(entry[..<equals])
                guard name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                    throw UsageError("--controller-header: '\(name)' is not a header name")
                }
                headers.append(
                    (
                        name,
                        try CommonOptions.secret(
                            String(entry[entry.index(after: equals)...]), origin: "--controller-header \(name)")
                    ))
            }
            var signingKey: [UInt8]? = nil
            if let path = options.string("controller-secret-file") {
                // A path, not `@/path`: read as `@@`, the key would be the path's text.
                guard !path.hasPrefix("@") else {
                    throw UsageError("--controller-secret-file: give the file's path without '@' (got '\(path)')")
                }
                let secret = try CommonOptions.secret("@" + path, origin: "--controller-secret-file")
                guard secret.utf8.count >= 16 else {
                    throw UsageError("--controller-secret-file: the secret in '\(path)' is shorter than 16 bytes")
                }
                signingKey = Array(secret.utf8)
            }
            for entry in urls {
                var name = "http"
                var text = entry
                if let equals = entry.firstIndex(of: "="), !entry[..<equals].contains(":") {
                    name = String(entry[..<equals])
                    text = String(entry[entry.index(after: equals)...])
                }
                guard let url = URL(string: text), let scheme = url.scheme, ["http", "https"].contains(scheme),
                    url.host != nil
                else {
                    throw UsageError("--controller-url: '\(Redaction.url(text))' is not an http(s) URL")
                }
                guard !names.contains(name) else { throw UsageError("--controller-url: name '\(name)' given twice") }
                router.register(
                    name,
                    HTTPController(
                        name: name, url: url, timeout: callTimeout, maxConnections: maxConnections, headers: headers,
                        signingKey: signingKey))
                names.append(name)
            }
        }
        let routes = options.strings("route")
        if routes.isEmpty {
            guard names.count == 1 else {
                throw UsageError("--route is required with several controllers (\(names.joined(separator: ", ")))")
            }
            router.route(.any, to: names[0])
        }
        for text in routes {
            guard let rule = PurchaseRouter.parseRoute(text) else {
                throw UsageError("--route: '\(text)' is not PREFIX=NAME, =EXACT_ID=NAME or *=NAME")
            }
            guard names.contains(rule.controllerName) else {
                throw UsageError(
                    "--route: no controller named '\(rule.controllerName)' (configured: \(names.joined(separator: ", ")))"
                )
            }
            router.route(rule.match, to: rule.controllerName)
        }
        return router
    }

    /// `/metrics`, `/healthz`, `/readyz`, `/status` and the status page `/` of `processor`, served on
    /// `listen`.
    static func operationsServer(listen: String, processor: PurchaseProcessor) throws(UsageError) -> OperationsServer {
        let server = try OperationsServer(address: listen) { path in
            switch path {
            case "/metrics":
                return .init(
                    status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: processor.metrics())
            case "/healthz", "/readyz":
                let health = processor.health()
                let ok = path == "/healthz" ? health.isAlive : health.isReady
                let reasons =
                    path == "/healthz"
                    ? health.reasons.filter { !$0.hasPrefix("not joined") && !$0.hasPrefix("restoring") }
                    : health.reasons
                return .init(status: ok ? 200 : 503, body: ok ? "ok\n" : reasons.joined(separator: "\n") + "\n")
            case "/status":
                return .init(status: 200, contentType: "application/json", body: processor.status().json + "\n")
            case "/":
                return .init(
                    status: 200, contentType: "text/html; charset=utf-8", body: StatusPage.html(processor.status()))
            default:
                return .init(status: 404, body: "not found: /, /status, /metrics, /healthz, /readyz\n")
            }
        }
        server.start()
        let host = listen.hasPrefix(":") ? "0.0.0.0" : String(listen[..<listen.lastIndex(of: ":")!])
        Logger(label: "encore").info(
            "operations endpoint listening on http://\(host):\(server.port) (/ status page, /status, /metrics, /healthz, /readyz)"
        )
        return server
    }

    /// The group's store under `--state-dir` (`none`: no store). The group id becomes a directory
    /// name, one per group: bytes other than letters, digits, `.`, `_` and `-` are written `%XX`,
    /// and so is a leading dot.
    static func stateDirectory(_ option: String, group: String) -> String? {
        guard option != "none" else { return nil }
        var name = ""
        for byte in group.utf8 {
            let kept =
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
                || byte == 0x5f || byte == 0x2d || (byte == 0x2e && !name.isEmpty)
            name += kept ? String(UnicodeScalar(byte)) : String(format: "%%%02X", byte)
        }
        return (option as NSString).appendingPathComponent(name)
    }

    static func execute(_ options: ParsedOptions) async throws -> Int32 {
        try options.noPositionals()
        var kafka = try CommonOptions.kafkaConfiguration(options)
        let partitions = try options.integer("partitions", range: 1...10_000)
        var (configuration, router) = try processorSetup(options, kafka: kafka)
        configuration.stateDirectory = stateDirectory(options.string("state-dir")!, group: configuration.groupID)
        configuration.stateCacheBytes = try options.integer("state-cache-mb", range: 1...1_000_000) << 20
        if options.string("state-cache-users") == "all" {
            configuration.residentUsers = nil
        } else {
            configuration.residentUsers = try options.integer("state-cache-users", range: 1...1_000_000_000)
            if configuration.stateDirectory == nil && options.isSet("state-cache-users") {
                throw UsageError("--state-cache-users needs a state store: --state-dir none keeps every user in memory")
            }
        }
        let embedded = options.flag("embedded-broker")
        if embedded && kafka.bootstrapServers != nil {
            throw UsageError("--embedded-broker and --bootstrap-servers exclude each other")
        }
        if !embedded && kafka.bootstrapServers == nil {
            throw UsageError(
                "no brokers: give --bootstrap-servers (or ENCORE_BOOTSTRAP_SERVERS), or --embedded-broker for a trial")
        }
        let listen = options.string("http-listen")
        if let listen {
            guard let colon = listen.lastIndex(of: ":"), UInt16(listen[listen.index(after: colon)...]) != nil else {
                throw UsageError("--http-listen: '\(listen)' is not HOST:PORT or :PORT")
            }
        }
        if options.endsAtCheck() { return 0 }
        let cluster = try CommonOptions.embeddedBrokerIfNeeded(
            &kafka, topics: CommonOptions.topicNames(options), partitions: partitions)
        configuration.kafka = kafka
        let routes = router.rules.map { "\($0.match)→\($0.controllerName)" }.joined(separator: ", ")
        Logger(label: "encore").info(
            "\(EncoreVersion.description): brokers \(Redaction.servers(kafka.bootstrapServers ?? "-")), group \(configuration.groupID), instance \(configuration.instanceID), \(configuration.guarantee.rawValue), routes \(routes)"
        )
        let processor = try PurchaseProcessor(configuration: configuration, router: router)
        let signals = SignalHandler { _ in processor.shutdown() }
        defer { signals.cancel() }
        let server = try listen.map { try Self.operationsServer(listen: $0, processor: processor) }
        defer { server?.stop() }
        try await processor.run()
        withExtendedLifetime(cluster) {}
        return 0
    }
}
