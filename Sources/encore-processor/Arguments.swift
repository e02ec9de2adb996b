import Foundation
import Kafka

/// A command-line option: a flag, or an option taking a value (`--name VALUE` or `--name=VALUE`).
struct OptionDefinition {
    let name: String
    let short: Character?
    let valueName: String?
    let help: String
    let environment: String?
    let repeatable: Bool
    let defaultValue: String?

    static func option(
        _ name: String, short: Character? = nil, value: String = "VALUE", default defaultValue: String? = nil,
        environment: String? = nil, repeatable: Bool = false, _ help: String
    ) -> OptionDefinition {
        OptionDefinition(
            name: name, short: short, valueName: value, help: help, environment: environment, repeatable: repeatable,
            defaultValue: defaultValue)
    }

    /// A flag; `commandLineOnly`: a safety switch no environment variable or config file sets.
    static func flag(_ name: String, _ help: String, commandLineOnly: Bool = false) -> OptionDefinition {
        OptionDefinition(
            name: name, short: nil, valueName: nil, help: help, environment: commandLineOnly ? "" : nil,
            repeatable: false, defaultValue: nil)
    }

    /// Given on the command line only (no environment variable, no config file key).
    var isCommandLineOnly: Bool { environment == "" }

    var isFlag: Bool { valueName == nil }

    /// The environment variable that sets it: the one named, else `ENCORE_<NAME>` (`-X` has none:
    /// librdkafka properties come from `-X` or the config file; an option defined with an empty
    /// `environment` has none either: safety switches are given on the command line only).
    var environmentName: String? {
        if let environment { return environment.isEmpty ? nil : environment }
        guard short == nil else { return nil }
        return "ENCORE_" + name.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    var spelling: String { short.map { "-\($0)" } ?? "--\(name)" }
}

/// A bad command line: printed with the command's name and a pointer to `--help`.
struct UsageError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// A subcommand's definition: its options and help text.
struct CommandDefinition {
    let name: String
    let summary: String
    let usage: String
    let options: [OptionDefinition]
    var discussion: String = ""

    func helpText() -> String {
        var lines = ["\(summary)", "", "Usage: encore-processor \(usage)", "", "Options:"]
        let rendered =
            options.map { option -> (String, String) in
                var left = option.short.map { "-\($0) " } ?? "--\(option.name)"
                if let value = option.valueName { left += option.short == nil ? " \(value)" : value }
                var help = option.help
                if let value = option.defaultValue { help += " (default: \(value))" }
                if let environment = option.environmentName { help += " [env: \(environment)]" }
                if option.repeatable { help += " (repeatable)" }
                return (left, help)
            } + [("-h, --help", "Show this help.")]
        let width = min(34, (rendered.map(\.0.count).max() ?? 0) + 2)
        for (left, help) in rendered {
            let padded =
                left.count >= width
                ? left + "\n" + String(repeating: " ", count: width + 2)
                : left.padding(toLength: width, withPad: " ", startingAt: 0)
            lines.append("  \(padded)\(help)")
        }
        if !discussion.isEmpty { lines += ["", discussion] }
        return lines.joined(separator: "\n")
    }

    /// Parses `arguments` (after the subcommand name). Returns `nil` when help was asked for.
    /// `sharedOptions`: option names of the other commands; a config file's `encore.` key naming
    /// one of them is theirs, not a mistake (one file serves `run` and `topics`).
    func parse(
        _ arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment,
        sharedOptions: Set<String> = []
    )
        throws(UsageError)
        -> ParsedOptions?
    {
        var values: [String: [String]] = [:]
        var flags = Set<String>()
        var positionals: [String] = []
        var index = 0
        func lookup(_ token: String) throws(UsageError) -> OptionDefinition {
            let found: OptionDefinition?
            if token.hasPrefix("--") {
                found = options.first { $0.name == String(token.dropFirst(2)) }
            } else {
                found = options.first { $0.short.map { "-\($0)" } == token }
            }
            guard let found else { throw UsageError("unknown option '\(token)'") }
            return found
        }
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if argument == "-h" || argument == "--help" { return nil }
            if argument == "--" {
                positionals += arguments[index...]
                break
            }
            guard argument.hasPrefix("-"), argument.count > 1 else {
                positionals.append(argument)
                continue
            }
            var token = argument
            var inline: String? = nil
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                token = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            } else if !argument.hasPrefix("--"), argument.count > 2 {
                // -Xkey=value, as kcat accepts.
                token = String(argument.prefix(2))
                inline = String(argument.dropFirst(2))
            }
            let option = try lookup(token)
            if option.isFlag {
                guard inline == nil else { throw UsageError("\(option.spelling) takes no value") }
                flags.insert(option.name)
                continue
            }
            let value: String
            if let inline {
                value = inline
            } else {
                guard index < arguments.count else {
                    throw UsageError("\(option.spelling) needs a value (\(option.valueName ?? "VALUE"))")
                }
                value = arguments[index]
                index += 1
            }
            // A single-valued option given again replaces the earlier value (the Unix and kcat habit:
            // wrappers and compose files override defaults that way).
            if option.repeatable {
                values[option.name, default: []].append(value)
            } else {
                values[option.name] = [value]
            }
        }
        var sources: [String: ParsedOptions.Source] = [:]
        for name in values.keys { sources[name] = .flag }
        for name in flags { sources[name] = .flag }
        // Then the environment, then the config file: a value given earlier wins.
        for option in options where values[option.name] == nil && !flags.contains(option.name) {
            guard let variable = option.environmentName, let value = environment[variable], !value.isEmpty else {
                continue
            }
            if try apply(value, to: option, from: "\(variable)", values: &values, flags: &flags) {
                sources[option.name] = .environment(variable)
            }
        }
        var fileProperties: [String] = []
        if options.contains(where: { $0.name == "config" }), let path = values["config"]?.last {
            // Within the file, a key given again replaces the earlier value, as on the command line.
            var fromFile = Set<String>()
            for (key, value) in try Self.readProperties(path) {
                guard key.hasPrefix("encore.") else {
                    fileProperties.append("\(key)=\(value)")
                    continue
                }
                let name = String(key.dropFirst("encore.".count))
                guard let option = options.first(where: { $0.name == name && $0.short == nil }) else {
                    if sharedOptions.contains(name) { continue }
                    throw UsageError("--config \(path): '\(key)' is not an option of any command")
                }
                guard !option.isCommandLineOnly else {
                    throw UsageError("--config \(path): --\(name) is given on the command line only")
                }
                // (A repeatable option's lines add up, as the flag given again does.)
                let earlier = fromFile.contains(name) && option.repeatable ? values[name] ?? [] : []
                if fromFile.contains(name) {
                    values[name] = nil
                    flags.remove(name)
                } else if values[name] != nil || flags.contains(name) {
                    continue
                }
                fromFile.insert(name)
                if try apply(value, to: option, from: "--config \(path): \(key)", values: &values, flags: &flags) {
                    sources[name] = .file(path)
                } else {
                    sources[name] = nil
                }
                if !earlier.isEmpty { values[name] = earlier + (values[name] ?? []) }
            }
        }
        if !fileProperties.isEmpty {
            // Before the command line's -X, so that those win.
            values["X"] = fileProperties + (values["X"] ?? [])
        }
        return ParsedOptions(
            definition: self, values: values, flags: flags, positionals: positionals, sources: sources)
    }

    /// Sets `option` from a value of the environment or the config file; `false` when a flag's
    /// value turns it off.
    private func apply(
        _ value: String, to option: OptionDefinition, from origin: String, values: inout [String: [String]],
        flags: inout Set<String>
    ) throws(UsageError) -> Bool {
        if option.isFlag {
            switch value.lowercased() {
            case "1", "true", "yes", "on": flags.insert(option.name)
            case "0", "false", "no", "off": return false
            default: throw UsageError("\(origin): '\(value)' is not true or false")
            }
            return true
        }
        // A list from one variable or key parses as the flag given once per comma-separated item
        // (header values, which may hold commas, excepted; a URL's password may hold one, so URLs
        // are cut only where the next one starts).
        let items =
            option.name.hasSuffix("-url") ? Redaction.urlEntries(value) : value.split(separator: ",")
        values[option.name] =
            option.repeatable && !option.name.contains("header")
            ? items.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            : [value]
        return true
    }

    /// `key=value` lines of a properties file (`#` and `!` start comments; spaces around `=` are
    /// trimmed), in order.
    static func readProperties(_ path: String) throws(UsageError) -> [(String, String)] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw UsageError("--config: cannot read '\(path)' (missing, a directory, or not readable)")
        }
        guard let text = String(data: data, encoding: .utf8), !text.contains("\0") else {
            throw UsageError("--config: '\(path)' is not UTF-8 text (expected key=value lines)")
        }
        var properties: [(String, String)] = []
        for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix("!") { continue }
            guard let equals = line.firstIndex(of: "="), equals != line.startIndex else {
                throw UsageError("--config \(path): line \(number + 1) is not key=value")
            }
            properties.append(
                (
                    line[..<equals].trimmingCharacters(in: .whitespaces),
                    line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                ))
        }
        return properties
    }
}

/// The parsed options of one command, with typed accessors whose errors name the option.
struct ParsedOptions {
    /// Where a value came from, for `--print-config`.
    enum Source: Equatable {
        case flag, environment(String), file(String)
    }

    let definition: CommandDefinition
    let values: [String: [String]]
    let flags: Set<String>
    let positionals: [String]
    var sources: [String: Source] = [:]

    /// How the option is written on the command line (`--name`, or `-X`).
    func spelling(_ name: String) -> String {
        definition.options.first { $0.name == name }?.spelling ?? "--\(name)"
    }

    func string(_ name: String) -> String? {
        values[name]?.last ?? definition.options.first { $0.name == name }?.defaultValue
    }

    func strings(_ name: String) -> [String] { values[name] ?? [] }

    func flag(_ name: String) -> Bool { flags.contains(name) }

    func isSet(_ name: String) -> Bool { values[name] != nil || flags.contains(name) }

    func integer(_ name: String, range: ClosedRange<Int> = Int.min...Int.max) throws(UsageError) -> Int {
        guard let text = string(name) else { throw UsageError("\(spelling(name)) is required") }
        guard let value = Int(text.replacingOccurrences(of: "_", with: "")), range.contains(value) else {
            throw UsageError("\(spelling(name)): expected an integer in \(describe(range)), got '\(text)'")
        }
        return value
    }

    func number(_ name: String, range: ClosedRange<Double>) throws(UsageError) -> Double {
        guard let text = string(name) else { throw UsageError("\(spelling(name)) is required") }
        guard let value = Double(text), value.isFinite, range.contains(value) else {
            throw UsageError(
                "\(spelling(name)): expected a number in \(range.lowerBound)...\(range.upperBound), got '\(text)'")
        }
        return value
    }

    /// A duration in milliseconds.
    func milliseconds(_ name: String, minimum: Int = 0) throws(UsageError) -> Duration {
        .milliseconds(try integer(name, range: minimum...Int(Int32.max)))
    }

    /// A duration written as a number with a unit (`90s`, `30m`, `12h`, `7d`), in milliseconds.
    func duration(_ name: String, range: ClosedRange<Int64>) throws(UsageError) -> Int64 {
        guard let text = string(name) else { throw UsageError("\(spelling(name)) is required") }
        let units: [Character: Int64] = ["s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000]
        guard let unit = text.last.flatMap({ units[$0] }), let count = Int64(text.dropLast()), count >= 0,
            count <= range.upperBound / unit, range.contains(count * unit)
        else {
            throw UsageError(
                "\(spelling(name)): expected a duration like 90s, 30m, 12h or 7d between \(range.lowerBound / 1000) s and \(range.upperBound / 86_400_000) d, got '\(text)'"
            )
        }
        return count * unit
    }

    func choice(_ name: String, _ allowed: [String]) throws(UsageError) -> String {
        guard let value = string(name) else { throw UsageError("\(spelling(name)) is required") }
        guard allowed.contains(value) else {
            throw UsageError("\(spelling(name)): '\(value)' is not one of \(allowed.joined(separator: ", "))")
        }
        return value
    }

    /// The one positional argument, which must be one of `allowed` (`dead-letters list`).
    func action(_ allowed: [String]) throws(UsageError) -> String {
        guard positionals.count == 1, let action = positionals.first, allowed.contains(action) else {
            let expected = allowed.map { "'\($0)'" }.joined(separator: " or ")
            throw UsageError("expected the action \(expected), got '\(positionals.joined(separator: " "))'")
        }
        return action
    }

    func noPositionals() throws(UsageError) {
        if let first = positionals.first { throw UsageError("unexpected argument '\(first)'") }
    }

    private func describe(_ range: ClosedRange<Int>) -> String {
        if range.upperBound == Int.max { return "\(range.lowerBound)..." }
        return "\(range.lowerBound)...\(range.upperBound)"
    }
}

extension ParsedOptions {
    /// Whether the command ends here, its configuration validated: `--check` says it is OK,
    /// `--print-config` prints it. Called where everything `run` would refuse has been checked, so
    /// neither accepts a configuration the command itself would refuse.
    func endsAtCheck() -> Bool {
        if flag("print-config") {
            print(printedConfiguration())
            return true
        }
        if flag("check") {
            print("configuration OK")
            return true
        }
        return false
    }

    /// The effective configuration as a config file (`--print-config`): every option with its
    /// value and where it came from, then the librdkafka properties; secrets redacted.
    func printedConfiguration() -> String {
        var lines = ["# encore-processor \(definition.name): effective configuration (secrets redacted)"]
        for option in definition.options where option.name != "X" && option.name != "print-config" {
            let value: String
            if option.isFlag {
                value = flags.contains(option.name) ? "true" : "false"
            } else if let given = values[option.name] {
                value = given.map { Self.shown($0, option: option.name) }.joined(separator: ",")
            } else if let fallback = option.defaultValue {
                value = fallback
            } else {
                continue
            }
            let origin: String
            switch sources[option.name] {
            case .flag?: origin = "command line"
            case .environment(let variable)?: origin = "env \(variable)"
            case .file(let path)?: origin = "config \(path)"
            case nil: origin = "default"
            }
            lines.append("encore.\(option.name)=\(value)  # \(origin)")
        }
        for assignment in strings("X") {
            guard let equals = assignment.firstIndex(of: "=") else { continue }
            let key = String(assignment[..<equals])
            let value = String(assignment[assignment.index(after: equals)...])
            // A secret file reference (`@/path`) names no secret; anything else secret is masked.
            let shown =
                value.hasPrefix("@") && !value.hasPrefix("@@")
                ? value
                : KafkaConfiguration.isKnownProperty(key) ? Redaction.display(value, forKey: key) : Redaction.mask
            lines.append("\(key)=\(shown)")
        }
        return lines.joined(separator: "\n")
    }

    /// An option's value as it may be printed.
    static func shown(_ value: String, option: String) -> String {
        if value.hasPrefix("@") && !value.hasPrefix("@@") { return value }
        if option.contains("header") {
            // A header's value is a credential more often than not.
            return value.firstIndex(of: "=").map { value[...$0] + Redaction.mask } ?? Redaction.mask
        }
        return Redaction.display(value, forKey: option)
    }
}
