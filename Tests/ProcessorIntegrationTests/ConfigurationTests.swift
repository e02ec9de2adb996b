import Foundation
import Testing

/// Configuration sources, safe defaults and secrets, against the real binary (no broker needed).
@Suite("Configuration: sources, safe defaults, secrets")
final class ConfigurationTests {
    /// The test's files (each test has an instance of its own), removed after it.
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("encore-configuration-\(UUID())")

    deinit { try? FileManager.default.removeItem(at: directory) }

    func temporaryFile(_ text: String) throws -> URL {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent(UUID().uuidString)
        try Data(text.utf8).write(to: file)
        return file
    }

    /// The value `--print-config` shows for `option`, and where it came from.
    func printed(_ output: String, _ option: String) -> (value: String, origin: String)? {
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("encore.\(option)=") }),
            let comment = line.range(of: "  # ")
        else { return nil }
        return (
            String(line[line.index(line.startIndex, offsetBy: "encore.\(option)=".count)..<comment.lowerBound]),
            String(line[comment.upperBound...])
        )
    }

    @Test("run needs brokers (or --embedded-broker) and a controller: --check says which is missing")
    func safeDefaults() async throws {
        let (noController, _, controllerError) = try await runBinary(["run", "--check", "--embedded-broker"])
        #expect(noController == 2 && controllerError.contains("--controller is required"), "\(controllerError)")
        let (noBrokers, _, brokersError) = try await runBinary(["run", "--check", "--controller", "simulated"])
        #expect(noBrokers == 2 && brokersError.contains("no brokers"), "\(brokersError)")
        let (trial, output, _) = try await runBinary([
            "run", "--check", "--controller", "simulated", "--embedded-broker",
        ])
        #expect(trial == 0 && output.contains("configuration OK"))
        let (fromFile, _, fileError) = try await runBinary(
            [
                "run", "--check", "--controller", "simulated", "--config",
                try temporaryFile("bootstrap.servers=k:9092\n").path,
            ])
        #expect(fromFile == 0, "bootstrap.servers in the config file counts: \(fileError)")
    }

    @Test("precedence: command line over environment over config file over default")
    func precedence() async throws {
        // (Complete, brokers and all: --print-config validates what it prints, as --check does.)
        let file = try temporaryFile(
            "# a comment\nencore.group-id = from-file\nencore.max-in-flight=11\nencore.workers=2\nclient.id=from-file\n"
                + "bootstrap.servers=kafka:9092\n"
        )
        defer { try? FileManager.default.removeItem(at: file) }
        let (status, output, error) = try await runBinary(
            [
                "run", "--print-config", "--config", file.path, "--controller", "simulated", "--max-in-flight", "33",
                "-X", "client.id=from-flag",
            ], environment: ["ENCORE_MAX_IN_FLIGHT": "22", "ENCORE_WORKERS": "3"])
        try #require(status == 0, "\(error)")
        #expect(printed(output, "max-in-flight")! == ("33", "command line"))
        #expect(printed(output, "workers")! == ("3", "env ENCORE_WORKERS"))
        #expect(printed(output, "group-id")! == ("from-file", "config \(file.path)"))
        #expect(printed(output, "call-timeout-ms")! == ("30000", "default"))
        // librdkafka properties: the command line's -X after the file's.
        let clientIDs = output.split(separator: "\n").filter { $0.hasPrefix("client.id=") }
        #expect(clientIDs == ["client.id=from-file", "client.id=from-flag"])
        // A list from the environment parses like the flag repeated.
        let (listed, lists, listError) = try await runBinary(
            ["run", "--check", "--embedded-broker", "--controller", "http", "--route", "rc_=a", "--route", "*=b"],
            environment: ["ENCORE_CONTROLLER_URL": "a=http://a:1/p,b=http://b:2/p"])
        #expect(listed == 0 && lists.contains("configuration OK"), "\(listError)")
        // A safety switch is command-line only.
        let unsafe = try temporaryFile("encore.allow-simulated-production=true\n")
        defer { try? FileManager.default.removeItem(at: unsafe) }
        let (refused, _, refusal) = try await runBinary([
            "run", "--check", "--embedded-broker", "--controller", "simulated", "--config", unsafe.path,
        ])
        #expect(refused == 2 && refusal.contains("command line only"), "\(refusal)")
    }

    @Test("a secret given every way never appears in stdout or stderr")
    func secrets() async throws {
        let secret = "hunter2-\(UUID().uuidString.prefix(8))"
        let secretFile = try temporaryFile(secret + "\n")
        let config = try temporaryFile("sasl.password=\(secret)\nencore.group-id=g\n")
        defer {
            try? FileManager.default.removeItem(at: secretFile)
            try? FileManager.default.removeItem(at: config)
        }
        let runs: [[String]] = [
            ["-X", "sasl.password=\(secret)", "--print-config"],
            ["-X", "sasl.password=@\(secretFile.path)", "--print-config"],
            ["--config", config.path, "--print-config"],
            ["-X", "sasl.pasword=\(secret)", "--check"],
            ["-X", "sasl.pasword=\(secret)", "--print-config"],
            ["--controller-header", "X-Billing-Key=\(secret)", "--print-config"],
            ["-X", "ssl.key.password=\(secret)", "-X", "security.protocol=nonsense", "--check"],
            ["-X", "sasl.jaas.config=x required password=\"\(secret)\"", "--check"],
            ["--controller-url", "http://user:\(secret)@billing:8080/p?token=\(secret)", "--print-config"],
            ["--bootstrap-servers", "user:\(secret)@k:9092", "--print-config"],
        ]
        for extra in runs {
            let (_, output, error) = try await runBinary(
                ["run", "--controller", "http", "--controller-url", "http://billing:8080/p", "--embedded-broker"]
                    + extra)
            #expect(!output.contains(secret) && !error.contains(secret), "\(extra): \(output)\n\(error)")
            #expect(!(output + error).isEmpty)
        }
        // A header from the environment, commas and all, is masked whole.
        let (_, printed, printedError) = try await runBinary(
            [
                "run", "--controller", "http", "--controller-url", "http://billing:8080/p", "--embedded-broker",
                "--print-config",
            ], environment: ["ENCORE_CONTROLLER_HEADER": "Authorization=Bearer abc,\(secret)"])
        #expect(!printed.contains(secret) && !printedError.contains(secret), "\(printed)")
        #expect(printed.contains("encore.controller-header=Authorization=[redacted]"), "\(printed)")
    }

    @Test("--version, help COMMAND")
    func versionAndHelp() async throws {
        let (status, version, _) = try await runBinary(["--version"])
        #expect(status == 0 && version.hasPrefix("encore-processor ") && version.contains("librdkafka"))
        let (helped, help, _) = try await runBinary(["help", "replay"])
        #expect(helped == 0 && help.contains("Usage: encore-processor replay"))
    }

    @Test("no part of a URL password is shown, commas and all; --print-config and --check agree on it")
    func urlPasswordWithComma() async throws {
        let url = "http://usrQ7:pwA1,pwB2@billing:8080/purchase?token=QueryTok55"
        let hidden = ["usrQ7", "pwA1", "pwB2", "QueryTok55"]
        let config = try temporaryFile("encore.controller-url=\(url)\n")
        defer { try? FileManager.default.removeItem(at: config) }
        let base = ["run", "--controller", "http", "--bootstrap-servers", "kafka:9092"]
        let ways: [(arguments: [String], environment: [String: String])] = [
            (["--controller-url", url], [:]),
            ([], ["ENCORE_CONTROLLER_URL": url]),
            (["--config", config.path], [:]),
            (["--route", "*=rc"], ["ENCORE_CONTROLLER_URL": "rc=\(url),sk=http://billing:8080/storekit"]),
        ]
        // Refused ones (no scheme; a query with a comma and a URL in it): the error shows none of it.
        for refused in [
            "usrQ7:pwA1,pwB2@billing:8080", "billing:8080/p?token=QueryTok55",
            "http://billing:8080/p?cb=a,https://x&token=QueryTok55",
        ] {
            let (_, output, error) = try await runBinary(base + ["--controller-url", refused, "--print-config"])
            for part in hidden {
                #expect(!(output + error).contains(part), "'\(part)' shown for \(refused): \(output)\(error)")
            }
        }
        for way in ways {
            let (printed, output, printError) = try await runBinary(
                base + way.arguments + ["--print-config"], environment: way.environment)
            let (checked, checkOutput, checkError) = try await runBinary(
                base + way.arguments + ["--check"], environment: way.environment)
            let shown = output + printError + checkOutput + checkError
            for part in hidden {
                #expect(!shown.contains(part), "\(way): '\(part)' shown in \(shown)")
            }
            #expect(printed == 0 && checked == 0, "\(way): --print-config \(printed), --check \(checked): \(shown)")
            #expect(output.contains("billing:8080/purchase"), "the host is still shown: \(output)")
        }
    }

    @Test("a config file's key given twice: the last wins, as on the command line; one file serves run and topics")
    func configFileRules() async throws {
        let file = try temporaryFile(
            "bootstrap.servers=kafka:9092\nencore.max-in-flight=11\nencore.max-in-flight=44\nencore.group-id=g\n"
                + "encore.controller=simulated\n")
        defer { try? FileManager.default.removeItem(at: file) }
        let (status, output, error) = try await runBinary(["run", "--print-config", "--config", file.path])
        try #require(status == 0, "\(error)")
        #expect(printed(output, "max-in-flight")?.value == "44", "\(output)")
        // A repeatable option's lines add up, as the flag given again does.
        let routes = try temporaryFile(
            "bootstrap.servers=kafka:9092\nencore.controller=http\nencore.controller-url=a=http://a:1/p\n"
                + "encore.controller-url=b=http://b:2/p\nencore.route=rc_=a\nencore.route=*=b\n"
                + "encore.controller-header=X-One=1\nencore.controller-header=X-Two=2\n")
        defer { try? FileManager.default.removeItem(at: routes) }
        let (listed, lists, listError) = try await runBinary(["run", "--print-config", "--config", routes.path])
        #expect(listed == 0, "\(listError)")
        for line in ["a=http://a:1/p", "b=http://b:2/p", "rc_=a", "*=b", "X-One=", "X-Two="] {
            #expect(lists.contains(line), "'\(line)' missing: \(lists)")
        }
        // -X is given as -X, or as a bare librdkafka key: `encore.X` is no key of any command.
        let bareX = try temporaryFile("bootstrap.servers=kafka:9092\nencore.X=bogus.key=1\n")
        defer { try? FileManager.default.removeItem(at: bareX) }
        let (xStatus, _, xError) = try await runBinary(["topics", "create", "--check", "--config", bareX.path])
        #expect(xStatus == 2 && xError.contains("encore.X"), "\(xError)")
        // Keys of run's options in a file topics also reads: they are run's, not a mistake.
        let (topics, _, topicsError) = try await runBinary(["topics", "create", "--check", "--config", file.path])
        #expect(topics == 0, "\(topicsError)")
        let typo = try temporaryFile("bootstrap.servers=kafka:9092\nencore.max-in-fligth=11\n")
        defer { try? FileManager.default.removeItem(at: typo) }
        let (refused, _, refusal) = try await runBinary(["topics", "create", "--check", "--config", typo.path])
        #expect(refused == 2 && refusal.contains("encore.max-in-fligth"), "\(refusal)")
    }

    @Test("--check and --print-config are given on the command line only: a stray ENCORE_CHECK never ends a run")
    func checkIsCommandLineOnly() async throws {
        for variable in ["ENCORE_CHECK", "ENCORE_PRINT_CONFIG"] {
            // No broker listens there: a run that went on fails to reach it, one that stopped at a
            // check or a printed configuration exits 0 having printed it.
            let (status, output, error) = try await runBinary(
                ["run", "--controller", "simulated", "--bootstrap-servers", "127.0.0.1:9"],
                environment: [variable: "1"])
            #expect(status != 0 && !output.contains("configuration OK"), "\(variable): \(output)\(error)")
            #expect(!output.contains("encore.controller="), "\(variable): \(output)")
        }
    }

    @Test("--controller-secret-file takes a path, not @/path: the literal '@' would sign with the path's text")
    func secretFileIsAPath() async throws {
        let (status, _, error) = try await runBinary([
            "run", "--check", "--bootstrap-servers", "kafka:9092", "--controller", "http", "--controller-url",
            "http://billing:8080/p", "--controller-secret-file", "@/run/secrets/encore/controller-signing-key",
        ])
        #expect(status == 2 && error.contains("--controller-secret-file"), "\(error)")
    }
}
