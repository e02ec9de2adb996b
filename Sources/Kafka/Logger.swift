import Foundation
import Synchronization

/// A small leveled logger writing one line per entry to standard error: text, or one JSON object
/// per line (`ts`, `level`, `logger`, `msg` and the entry's fields).
///
/// librdkafka's own log and error callbacks are routed here, so every line of the process has one
/// format. The threshold comes from `ENCORE_LOG_LEVEL` (`debug`, `info`, `warning`, `error`).
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CaseIterable {
        case debug, info, warning, error

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

        /// Parses `debug`, `info`, `warning`/`warn` or `error`.
        public init?(name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }

        /// Maps a syslog level as used by librdkafka (0 emergency ... 7 debug).
        init(syslog: Int32) {
            switch syslog {
            case ...3: self = .error
            case 4: self = .warning
            case 5, 6: self = .info
            default: self = .debug
            }
        }
    }

    /// How lines are written.
    public enum Format: Int, Sendable {
        case text, json
    }

    public let label: String

    public init(label: String) {
        self.label = label
    }

    /// The process-wide threshold; entries below it are dropped.
    public static var threshold: Level {
        get { Level(rawValue: thresholdStorage.load(ordering: .relaxed)) ?? .info }
        set { thresholdStorage.store(newValue.rawValue, ordering: .relaxed) }
    }

    private static let thresholdStorage = Atomic<Int>(
        (ProcessInfo.processInfo.environment["ENCORE_LOG_LEVEL"].flatMap(Level.init(name:)) ?? .info).rawValue)

    /// The process-wide line format.
    public static var format: Format {
        get { Format(rawValue: formatStorage.load(ordering: .relaxed)) ?? .text }
        set { formatStorage.store(newValue.rawValue, ordering: .relaxed) }
    }

    private static let formatStorage = Atomic<Int>(Format.text.rawValue)

    public func isEnabled(_ level: Level) -> Bool { level >= Logger.threshold }

    /// Logs `message` with `fields` (`request_id`, `topic`, `partition`, `offset`...): keys of the
    /// JSON object, or `key=value` after the text.
    public func log(_ level: Level, _ message: @autoclosure () -> String, fields: [(String, String)] = []) {
        guard isEnabled(level) else { return }
        let text = message()
        if level >= .warning { Self.recentEntries.withLock { $0.append(Entry(level, label, text, fields)) } }
        FileHandle.standardError.write(Data(Self.line(level, label, text, fields: fields).utf8))
    }

    /// A warning or error as logged (for the status page; log lines carry no secrets).
    public struct Entry: Sendable {
        public let timestamp: String
        public let level: Level
        public let logger: String
        public let message: String

        init(_ level: Level, _ logger: String, _ message: String, _ fields: [(String, String)]) {
            self.timestamp = Logger.timestamp()
            self.level = level
            self.logger = logger
            self.message = ([message] + fields.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
        }
    }

    /// The last ``recentCapacity`` warnings and errors logged, oldest first.
    public static var recent: [Entry] { recentEntries.withLock { $0.entries } }

    public static let recentCapacity = 20

    private static let recentEntries = Mutex(RecentEntries())

    private struct RecentEntries {
        var ring: [Entry] = []
        var next = 0

        mutating func append(_ entry: Entry) {
            if ring.count < Logger.recentCapacity {
                ring.append(entry)
            } else {
                ring[next] = entry
                next = (next + 1) % Logger.recentCapacity
            }
        }

        var entries: [Entry] { Array(ring[next...] + ring[..<next]) }
    }

    static func line(_ level: Level, _ label: String, _ message: String, fields: [(String, String)]) -> String {
        switch format {
        case .text:
            let suffix = fields.map { " \($0.0)=\($0.1)" }.joined()
            return "\(Logger.timestamp()) \(level) [\(label)] \(message)\(suffix)\n"
        case .json:
            var line = "{\"ts\":\(quoted(timestamp())),\"level\":\(quoted("\(level)")),\"logger\":\(quoted(label))"
            line += ",\"msg\":\(quoted(message))"
            for (key, value) in fields { line += ",\(quoted(key)):\(quoted(value))" }
            return line + "}\n"
        }
    }

    /// `text` as a JSON string.
    static func quoted(_ text: String) -> String {
        var quoted = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": quoted += "\\\""
            case "\\": quoted += "\\\\"
            case "\n": quoted += "\\n"
            case "\r": quoted += "\\r"
            case "\t": quoted += "\\t"
            case _ where scalar.value < 0x20: quoted += String(format: "\\u%04x", scalar.value)
            default: quoted.unicodeScalars.append(scalar)
            }
        }
        return quoted + "\""
    }

    public func debug(_ message: @autoclosure () -> String, fields: [(String, String)] = []) {
        log(.debug, message(), fields: fields)
    }
    public func info(_ message: @autoclosure () -> String, fields: [(String, String)] = []) {
        log(.info, message(), fields: fields)
    }
    public func warning(_ message: @autoclosure () -> String, fields: [(String, String)] = []) {
        log(.warning, message(), fields: fields)
    }
    public func error(_ message: @autoclosure () -> String, fields: [(String, String)] = []) {
        log(.error, message(), fields: fields)
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var tm = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &tm)
        let millis = now.tv_nsec / 1_000_000
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
            tm.tm_min, tm.tm_sec, Int(millis))
    }
}
