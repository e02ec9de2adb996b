import Foundation
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The URL session's delegate for the http controller's calls: follows no redirect, and reads an
/// answer up to a limit (then cancels the transfer), bridging each call to `async`.
final class HTTPCalls: NSObject, URLSessionDataDelegate, Sendable {
    struct Answer {
        let response: HTTPURLResponse
        let data: Data
        /// The body was longer than the limit: `data` holds its beginning.
        let truncated: Bool
    }

    private struct Call {
        let continuation: CheckedContinuation<Answer, any Error>
        var response: HTTPURLResponse? = nil
        var data = Data()
        var truncated = false
    }

    private let limit: Int
    private let calls = Mutex<[Int: Call]>([:])

    init(limit: Int) {
        self.limit = limit
    }

    func perform(_ request: URLRequest, in session: URLSession) async throws -> Answer {
        let task = session.dataTask(with: request)
        let id = task.taskIdentifier
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                calls.withLock { $0[id] = Call(continuation: continuation) }
                // Cancelled before the call was recorded: onCancel found nothing to cancel.
                if Task.isCancelled, let call = calls.withLock({ $0.removeValue(forKey: id) }) {
                    call.continuation.resume(throwing: CancellationError())
                    return
                }
                task.resume()
            }
        } onCancel: {
            task.cancel()
        }
    }

    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        // A 307 would re-POST a purchase to wherever it points: the 3xx is the answer.
        completionHandler(nil)
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        calls.withLock { $0[dataTask.taskIdentifier]?.response = response as? HTTPURLResponse }
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let over = calls.withLock { calls -> Bool in
            guard var call = calls[dataTask.taskIdentifier], !call.truncated else { return false }
            let room = limit - call.data.count
            call.data.append(data.prefix(max(0, room)))
            call.truncated = data.count > room
            calls[dataTask.taskIdentifier] = call
            return call.truncated
        }
        if over { dataTask.cancel() }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let call = calls.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        let response = call.response ?? task.response as? HTTPURLResponse
        if let response, call.truncated || error == nil {
            call.continuation.resume(returning: Answer(response: response, data: call.data, truncated: call.truncated))
        } else {
            call.continuation.resume(throwing: error ?? URLError(.badServerResponse))
        }
    }
}
