import EncoreEvents
import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Forwards each purchase to an HTTP endpoint of the app's billing service, so a backend in any
/// language can be the controller.
///
/// POSTs the request event's JSON with `Idempotency-Key: <request_id>` and `Encore-Attempt: <n>`
/// (and `Encore-Recovery: true` on a recovery call: look the purchase up before charging), and
/// expects `{"result":"purchased|cancelled|pending"}`. 5xx, 429 and connection errors are
/// retryable; other 4xx and malformed answers are final.
public struct HTTPController: PurchaseController {
    public let url: URL
    public let timeout: Duration
    private let session: URLSession

    /// - Parameter maxConnections: connections kept to the endpoint; match `--max-in-flight` so calls
    ///   do not queue inside the HTTP client while their timeout runs.
    public init(url: URL, timeout: Duration = .seconds(300), maxConnections: Int = 256) {
        self.url = url
        self.timeout = timeout
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = maxConnections
        configuration.timeoutIntervalForRequest = Double(timeout.components.seconds) + 1
        session = URLSession(configuration: configuration)
    }

    public func purchase(_ request: PurchaseRequest) async throws -> PurchaseResult {
        var httpRequest = URLRequest(url: url)
        httpRequest.httpMethod = "POST"
        httpRequest.httpBody = Data(request.event.jsonBytes())
        httpRequest.setValue("application/json", forHTTPHeaderField: "Content-Type")
        httpRequest.setValue(request.requestId, forHTTPHeaderField: "Idempotency-Key")
        httpRequest.setValue(String(request.attempt), forHTTPHeaderField: "Encore-Attempt")
        if request.isRecovery { httpRequest.setValue("true", forHTTPHeaderField: "Encore-Recovery") }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await session.data(for: httpRequest)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw PurchaseControllerError.retryable(
                "connection", "\(url.absoluteString): \(error.localizedDescription)")
        }
        guard let http = response as? HTTPURLResponse else {
            throw PurchaseControllerError.final("bad_response", "not an HTTP response")
        }
        let status = http.statusCode
        let body = String(decoding: data.prefix(512), as: UTF8.self)
        if status >= 500 || status == 429 {
            throw PurchaseControllerError.retryable("http_\(status)", "billing answered \(status): \(body)")
        }
        guard (200..<300).contains(status) else {
            throw PurchaseControllerError.final("http_\(status)", "billing answered \(status): \(body)")
        }
        guard case .object(let fields)? = try? JSONValue.parse(Array(data)),
            case .string(let result)? = fields["result"]
        else {
            throw PurchaseControllerError.final("bad_response", "expected {\"result\": ...}, got: \(body)")
        }
        switch result {
        case "purchased": return .purchased
        case "cancelled": return .cancelled
        case "pending": return .pending
        default: throw PurchaseControllerError.final("bad_response", "unknown result '\(result)'")
        }
    }
}
