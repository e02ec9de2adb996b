import Foundation
import Synchronization

/// A small leveled logger writing one line per entry to standard error.
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

    public func isEnabled(_ level: Level) -> Bool { level >= Logger.threshold }

    public func log(_ level: Level, _ message: @autoclosure () -> String) {
        guard isEnabled(level) else { return }
        let line = "\(Logger.timestamp()) \(level) [\(label)] \(message())\n"
        FileHandle.standardError.write(Data(line.utf8))
    }

    public func debug(_ message: @autoclosure () -> String) { log(.debug, message()) }
    public func info(_ message: @autoclosure () -> String) { log(.info, message()) }
    public func warning(_ message: @autoclosure () -> String) { log(.warning, message()) }
    public func error(_ message: @autoclosure () -> String) { log(.error, message()) }

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
