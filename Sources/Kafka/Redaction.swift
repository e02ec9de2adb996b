/// What must never reach a log, an error, a printed configuration or a topic: the values of
/// secret-bearing keys and the credentials in URLs.
public enum Redaction {
    /// What a secret is shown as.
    public static let mask = "[redacted]"

    /// Whether `key`'s value is a secret: `*password*`, `*secret*`, `*token*`, `sasl.jaas.config`,
    /// `sasl.oauthbearer.config`, and `*.key*` (TLS keys and keystores).
    public static func isSecret(key: String) -> Bool {
        let key = key.lowercased()
        return key.contains("password") || key.contains("secret") || key.contains("token")
            || key == "sasl.jaas.config" || key.hasSuffix("oauthbearer.config") || key.contains(".key")
    }

    /// `value` as it may be shown for `key`.
    public static func display(_ value: String, forKey key: String) -> String {
        isSecret(key: key) ? mask : url(value)
    }

    /// A URL (or a comma-separated list of them) without user info and query: credentials and
    /// tokens live there. Text that is not a URL is returned as it is.
    ///
    /// A password may hold a comma, and so may a query, so a list is cut only before an entry
    /// that starts a URL of its own (`scheme://` or `NAME=scheme://`) and never after a `?` or
    /// `#`; text with an `@` but no scheme is one entry. Everything up to an entry's last `@` is
    /// masked, and everything from its first `?` or `#` is left out, scheme or not: what is shown
    /// may lose a host, never a part of a password or a token.
    public static func url(_ text: String) -> String {
        redactionEntries(text).map { part -> String in
            var entry = String(part)
            // user:password@host → ***@host (in URLs and in bare host lists alike).
            if let at = entry.lastIndex(of: "@") {
                let start = entry.range(of: "://")?.upperBound ?? entry.startIndex
                if start < at { entry.replaceSubrange(start..<at, with: "***") }
            }
            if entry.contains("://") || entry.contains("/") || entry.contains("@"),
                let query = entry.firstIndex(where: { $0 == "?" || $0 == "#" })
            {
                entry = String(entry[..<query])
            }
            return entry
        }.joined(separator: ",")
    }

    /// The entries ``url(_:)`` redacts one by one (see there).
    private static func redactionEntries(_ text: String) -> [Substring] {
        guard text.contains("://") else {
            return text.contains("@") ? [text[...]] : text.split(separator: ",", omittingEmptySubsequences: false)
        }
        var entries: [Substring] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            if let previous = entries.last, !startsURL(item) || previous.contains("?") || previous.contains("#") {
                entries[entries.count - 1] = text[previous.startIndex..<item.endIndex]
            } else {
                entries.append(item)
            }
        }
        return entries
    }

    /// `text` cut at the commas that start a URL (`scheme://`, or `NAME=scheme://`); text with no
    /// `://` at all (a bootstrap server list) at every comma.
    public static func urlEntries(_ text: String) -> [Substring] {
        let items = text.split(separator: ",", omittingEmptySubsequences: false)
        guard text.contains("://") else { return items }
        var entries: [Substring] = []
        for item in items {
            if entries.isEmpty || startsURL(item) {
                entries.append(item)
            } else {
                let previous = entries.removeLast()
                entries.append(text[previous.startIndex..<item.endIndex])
            }
        }
        return entries
    }

    /// Whether `item` starts with `scheme://` or `NAME=scheme://` (spaces before it ignored).
    private static func startsURL(_ item: Substring) -> Bool {
        var rest = item.drop { $0 == " " }
        if let equals = rest.firstIndex(of: "="), let colon = rest.firstIndex(of: ":"), equals < colon {
            rest = rest[rest.index(after: equals)...]
        }
        guard let separator = rest.range(of: "://") else { return false }
        let scheme = rest[..<separator.lowerBound]
        return scheme.first?.isLetter == true
            && scheme.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "+.-".contains($0)) }
    }

    /// Bootstrap servers as they may be shown.
    public static func servers(_ text: String) -> String { url(text) }

    /// `text` with every occurrence of `secret` masked (for messages of other libraries that may
    /// echo a value).
    public static func scrub(_ text: String, secret: String) -> String {
        guard secret.count >= 3 else { return text }
        return text.replacingOccurrences(of: secret, with: mask)
    }
}
