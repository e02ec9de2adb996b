import Foundation
import EncoreProcessor
import Kafka

let commands: [(definition: CommandDefinition, execute: (ParsedOptions) async throws -> Int32)] = [
    (RunCommand.definition, RunCommand.execute),
    (DemoCommand.definition, DemoCommand.execute),
    (GenerateCommand.definition, GenerateCommand.execute),
    (LoadTestCommand.definition, LoadTestCommand.execute),
    (TopicsCommand.definition, TopicsCommand.execute),
    (BrokerCommand.definition, BrokerCommand.execute),
    (BenchCommand.definition, BenchCommand.execute),
    (EntitlementsCommand.definition, EntitlementsCommand.execute),
    (DeadLettersCommand.definition, DeadLettersCommand.execute),
    (AuditCommand.definition, AuditCommand.execute),
    (OffsetsCommand.definition, OffsetsCommand.execute),
    (ReplayCommand.definition, ReplayCommand.execute),
    (StateCheckCommand.definition, StateCheckCommand.execute),
]

@MainActor func overview() -> String {
    var lines = [
        "encore-processor: Encore's purchase controller on Kafka.", "",
        "Usage: encore-processor <command> [options]", "", "Commands:",
    ]
    for (definition, _) in commands {
        lines.append("  " + definition.name.padding(toLength: 14, withPad: " ", startingAt: 0) + definition.summary)
    }
    lines += ["", "Run 'encore-processor <command> --help' for a command's options."]
    return lines.joined(separator: "\n")
}

func fail(_ message: String, usage: Int32 = 2) -> Never {
    FileHandle.standardError.write(Data("encore-processor: \(printable(message))\n".utf8))
    exitAfterKafkaClients(usage)
}

/// Exits once every librdkafka client is destroyed (10 s at most): one still being destroyed on
/// another thread when the process exits crashed librdkafka 2.16 ("double free or corruption"
/// after `topics create`, "corrupted size vs. prev_size" after a processor stopped).
func exitAfterKafkaClients(_ status: Int32) -> Never {
    if !KafkaClients.waitUntilAllDestroyed(timeout: .seconds(10)) {
        FileHandle.standardError.write(
            Data("encore-processor: librdkafka clients were still open 10 s after the command ended; exiting\n".utf8))
    }
    exit(status)
}

/// `text` with control characters but line breaks and tabs written as `\u{1B}`: a value from the
/// environment or a file, echoed in an error, never drives the reader's terminal.
func printable(_ text: String) -> String {
    var shown = ""
    for scalar in text.unicodeScalars {
        let isControl = scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
        if isControl && scalar != "\n" && scalar != "\t" {
            shown += "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
        } else {
            shown.unicodeScalars.append(scalar)
        }
    }
    return shown
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let name = arguments.first else { fail("missing command\n\n" + overview()) }
if name == "--version" || name == "version" {
    print(EncoreVersion.description)
    exit(0)
}
if name == "-h" || name == "--help" || name == "help" {
    if arguments.count > 1 {
        guard let command = commands.first(where: { $0.definition.name == arguments[1] }) else {
            fail("unknown command '\(arguments[1])'\n\n" + overview())
        }
        print(command.definition.helpText())
    } else {
        print(overview())
    }
    exit(0)
}
guard let command = commands.first(where: { $0.definition.name == name }) else {
    fail("unknown command '\(name)'\n\n" + overview())
}
let status: Int32
do {
    let shared = Set(commands.flatMap { $0.definition.options.filter { $0.short == nil }.map(\.name) })
    guard let options = try command.definition.parse(Array(arguments.dropFirst()), sharedOptions: shared) else {
        print(command.definition.helpText())
        exit(0)
    }
    // A command with --check validates all it would before printing (see `endsAtCheck()`).
    if options.flag("print-config") && !options.definition.options.contains(where: { $0.name == "check" }) {
        print(options.printedConfiguration())
        exit(0)
    }
    status = try await command.execute(options)
} catch let error as UsageError {
    fail("\(name): \(error.message)\nRun 'encore-processor \(name) --help' for usage.")
} catch {
    fail("\(name): \(error)", usage: 1)
}
exitAfterKafkaClients(status)
