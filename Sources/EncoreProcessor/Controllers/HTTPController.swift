import EncoreEvents
import Foundation
import Kafka

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Forwards each purchase to an HTTP endpoint of the app's billing service, so a backend in any
/// language can be the controller.
///
/// POSTs the request event's JSON with `Idempotency-Key: <request_id>` and `Encore-Attempt: <n>`
/// (and `Encore-Recovery: true` on a recovery call: look the purchase up before charging), the
/// request's `traceparent`/`tracestate`, the configured headers, and with a signing key
/// `Encore-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. Expects
/// `{"result":"purchased|cancelled|pending"}`. 5xx, 429, 409 (billing still works on a call with
/// the same key), a connection lost after sending and a 2xx whose body cannot be read leave the
/// effect unknown (retried as recovery calls, in doubt when the attempts run out); a connection
/// that never opened is retryable; other 4xx and 3xx (redirects are never followed) are final.
/// Answers are read up to ``maximumResponseBytes``; errors name the controller, never the URL's
/// credentials or query, and quote at most a short, sanitised excerpt of the body.
public struct HTTPController: PurchaseController {
    /// Bytes of an answer read at most.
    public static let maximumResponseBytes = 64 * 1024
    /// Characters of billing's body an error quotes at most.
    public static let excerptLength = 120

    public let name: String
    public let url: URL
    public let timeout: Duration
    /// Headers added to every call (`Authorization`...).
    public let headers: [(name: String, value: String)]
    private let signingKey: [UInt8]?
    private let session: URLSession
    private let calls: HTTPCalls

    /// - Parameters:
    ///   - maxConnections: connections kept to the endpoint; match `--max-in-flight` so calls do not
    ///     queue inside the HTTP client while their timeout runs.
    ///   - signingKey: signs every call (`Encore-Signature`) so billing can tell it came from us.
    public init(
        name: String = "http", url: URL, timeout: Duration = .seconds(300), maxConnections: Int = 256,
        headers: [(name: String, value: String)] = [], signingKey: [UInt8]? = nil
    ) {
        self.name = name
        self.url = url
        self.timeout = timeout
        self.headers = headers
        self.signingKey = signingKey
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = maxConnections
        configuration.timeoutIntervalForRequest = Double(timeout.components.seconds) + 1
        calls = HTTPCalls(limit: Self.maximumResponseBytes)
        session = URLSession(configuration: configuration, delegate: calls, delegateQueue: nil)
    }

    /// How the controller is named in errors and logs: its name and where it posts, without
    /// credentials or query.
    public var label: String {
        let port = url.port.map { ":\($0)" } ?? ""
        return "controller '\(name)' (\(url.host ?? "?")\(port)\(url.path))"
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        let body = request.event.jsonBytes()
        var httpRequest = URLRequest(url: url)
        httpRequest.httpMethod = "POST"
        httpRequest.httpBody = Data(body)
        httpRequest.setValue("application/json", forHTTPHeaderField: "Content-Type")
        httpRequest.setValue(request.requestId, forHTTPHeaderField: "Idempotency-Key")
        httpRequest.setValue(String(request.attempt), forHTTPHeaderField: "Encore-Attempt")
        if request.isRecovery { httpRequest.setValue("true", forHTTPHeaderField: "Encore-Recovery") }
        if let traceparent = request.traceparent {
            httpRequest.setValue(traceparent, forHTTPHeaderField: "traceparent")
        }
        if let tracestate = request.tracestate { httpRequest.setValue(tracestate, forHTTPHeaderField: "tracestate") }
        for header in headers { httpRequest.setValue(header.value, forHTTPHeaderField: header.name) }
        if let signingKey {
            let seconds = Int64(Date().timeIntervalSince1970)
            httpRequest.setValue(
                RequestSignature.header(key: signingKey, body: body, unixSeconds: seconds),
                forHTTPHeaderField: RequestSignature.headerName)
        }
        let answer: HTTPCalls.Answer
        do {
            answer = try await calls.perform(httpRequest, in: session)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            if Task.isCancelled { throw CancellationError() }
            let message = "\(label): \(scrubbed(error.localizedDescription))"
            // Only a connection that never opened is known not to have reached billing.
            if let error = error as? URLError, Self.neverSent.contains(error.code) {
                throw PurchaseControllerError.retryable("connection", message)
            }
            throw PurchaseControllerError.outcomeUnknown("connection", message)
        }
        let status = answer.response.statusCode
        let excerpt = Self.excerpt(answer.data)
        if status >= 500 || status == 429 || status == 409 {
            // Billing may have acted before it failed; a 409 says it still works on a call with this
            // Idempotency-Key (Stripe's idempotency_key_in_use), whose effect is not known yet.
            throw PurchaseControllerError.outcomeUnknown("http_\(status)", "\(label) answered \(status): \(excerpt)")
        }
        if (300..<400).contains(status) {
            throw PurchaseControllerError.final(
                "http_\(status)", "\(label) answered \(status), a redirect: redirects are never followed")
        }
        guard (200..<300).contains(status) else {
            throw PurchaseControllerError.final("http_\(status)", "\(label) answered \(status): \(excerpt)")
        }
        guard !answer.truncated, case .object(let fields)? = try? JSONValue.parse(Array(answer.data)),
            case .string(let result)? = fields["result"]
        else {
            // Billing accepted the call and may have charged: unknown, never a failure.
            let what = answer.truncated ? "an answer over \(Self.maximumResponseBytes) bytes" : excerpt
            throw PurchaseControllerError.outcomeUnknown(
                "bad_response",
                "\(label) answered \(status) with an unreadable body: expected {\"result\": ...}, got \(what)")
        }
        switch result {
        case "purchased": return .purchased
        case "cancelled": return .cancelled
        case "pending": return .pending
        default:
            throw PurchaseControllerError.outcomeUnknown(
                "bad_response",
                "\(label) answered \(status) with an unknown result '\(Self.excerpt(Data(result.utf8)))'")
        }
    }

    /// The HTTP client's errors for a call that never left this host.
    static let neverSent: Set<URLError.Code> = [
        .cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .unsupportedURL, .badURL,
    ]

    /// A message of the HTTP client, without the URL's credentials or query.
    private func scrubbed(_ text: String) -> String {
        var text = Redaction.scrub(text, secret: url.absoluteString)
        if let user = url.user { text = Redaction.scrub(text, secret: user) }
        if let password = url.password { text = Redaction.scrub(text, secret: password) }
        if let query = url.query { text = Redaction.scrub(text, secret: query) }
        return text
    }

    /// At most ``excerptLength`` printable characters of `data`, whitespace collapsed.
    static func excerpt(_ data: Data) -> String {
        var excerpt = ""
        var lastWasSpace = false
        for scalar in String(decoding: data.prefix(excerptLength * 4), as: UTF8.self).unicodeScalars {
            guard excerpt.count < excerptLength else {
                excerpt += "..."
                break
            }
            if scalar.properties.isWhitespace {
                if !lastWasSpace && !excerpt.isEmpty { excerpt.append(" ") }
                lastWasSpace = true
            } else if scalar.isASCII && scalar.value >= 0x20 && scalar.value < 0x7F {
                excerpt.unicodeScalars.append(scalar)
                lastWasSpace = false
            }
        }
        return excerpt.isEmpty ? "(no body)" : excerpt
    }
}

/// `Encore-Signature` (the Stripe webhook habit): billing recomputes the HMAC with the shared
/// secret and compares, and refuses old timestamps.
public enum RequestSignature {
    public static let headerName = "Encore-Signature"

    /// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
    public static func header(key: [UInt8], body: [UInt8], unixSeconds: Int64) -> String {
        let signed = Array("\(unixSeconds).".utf8) + body
        return "t=\(unixSeconds),v1=" + HMACSHA256.hex(HMACSHA256.digest(key: key, message: signed))
    }
}
