import Foundation

/// The CloudEvents Kafka binding headers (binary mode) written on every record we produce.
public struct CloudEventHeaders: Sendable, Hashable {
    public static let specVersion = "1.0"
    public static let contentType = "application/json"

    public var id: String
    public var source: String
    public var type: String
    /// Milliseconds since the epoch; written as RFC 3339 in `ce_time`.
    public var timeMs: Int64?

    public init(id: String, source: String, type: EventType, timeMs: Int64) {
        self.init(id: id, source: source, type: type.rawValue, timeMs: timeMs)
    }

    public init(id: String, source: String, type: String, timeMs: Int64?) {
        self.id = id
        self.source = source
        self.type = type
        self.timeMs = timeMs
    }

    /// The known event type, when `type` is one of the contract's.
    public var eventType: EventType? { EventType(rawValue: type) }

    /// Header name/value pairs in the order they are written.
    public var headers: [(key: String, value: String)] {
        var headers: [(key: String, value: String)] = [
            ("ce_specversion", Self.specVersion), ("ce_id", id), ("ce_source", source), ("ce_type", type),
        ]
        if let timeMs { headers.append(("ce_time", Self.rfc3339(ms: timeMs))) }
        headers.append(("content-type", Self.contentType))
        return headers
    }

    /// Reads the headers when a record carries them (`ce_id`, `ce_source` and `ce_type` at least).
    public init?(headers: [(key: String, value: String?)]) {
        func value(_ name: String) -> String? { headers.last { $0.key == name }?.value ?? nil }
        guard let id = value("ce_id"), let source = value("ce_source"), let type = value("ce_type") else {
            return nil
        }
        self.init(id: id, source: source, type: type, timeMs: value("ce_time").flatMap(Self.parseRFC3339(ms:)))
    }

    /// Formats milliseconds since the epoch as `2026-11-30T04:07:23.123Z`.
    public static func rfc3339(ms: Int64) -> String {
        String(decoding: rfc3339Bytes(ms: ms), as: UTF8.self)
    }

    /// ``rfc3339(ms:)`` as UTF-8 bytes, for a header value.
    public static func rfc3339Bytes(ms: Int64) -> [UInt8] {
        var seconds = time_t(ms.quotientAndRemainder(dividingBy: 1000).quotient)
        let millis = Int(ms - Int64(seconds) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        // Hand-formatted: String(format:) costs more than the rest of an outcome's encoding.
        var text = [UInt8]()
        text.reserveCapacity(24)
        func digits(_ value: Int, _ width: Int) {
            var divisor = 1
            for _ in 1..<width { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                text.append(UInt8(ascii: "0") + UInt8(rest / divisor % 10))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        text.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        text.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        text.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        text.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        text.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        text.append(UInt8(ascii: "."))
        digits(millis, 3)
        text.append(UInt8(ascii: "Z"))
        return text
    }

    /// Parses RFC 3339 timestamps (`Z` or numeric offsets, optional fraction) to milliseconds.
    public static func parseRFC3339(ms text: String) -> Int64? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return Int64((date.timeIntervalSince1970 * 1000).rounded()) }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text).map { Int64($0.timeIntervalSince1970 * 1000) }
    }
}
