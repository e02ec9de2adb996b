import Foundation
import Kafka
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A small GET-only HTTP/1.1 server for `/metrics`, `/healthz`, `/readyz`, `/status` and `/`: one
/// thread accepts connections and reads their requests, at most ``maximumConnections`` answers are
/// prepared at once (others get 503), requests of at most ``maximumRequestBytes`` within
/// ``readTimeoutSeconds``, and every connection closed after its answer.
///
/// A client that connects and sends nothing costs a slot among at most
/// ``maximumWaitingConnections`` waiting ones, and the oldest of those is shed to make room for a
/// new one: idle or reconnecting clients cannot keep a probe from being answered.
final class OperationsServer: Sendable {
    struct Response: Sendable {
        var status: Int
        var contentType = "text/plain; charset=utf-8"
        var body: String
    }

    static let maximumConnections = 8
    static let maximumWaitingConnections = 64
    static let maximumRequestBytes = 8 * 1024
    static let readTimeoutSeconds = 2

    /// The port it listens on (the one asked for, or the one the system chose for port 0).
    let port: Int
    private let socket: Int32
    private let stopping = Atomic<Bool>(false)
    private let connections = Atomic<Int>(0)
    private let handler: @Sendable (String) -> Response

    /// Listens on `address` (`HOST:PORT`, `:PORT` for every interface).
    init(address: String, handler: @escaping @Sendable (String) -> Response) throws(UsageError) {
        guard let colon = address.lastIndex(of: ":"), let port = UInt16(address[address.index(after: colon)...]) else {
            throw UsageError("--http-listen: '\(address)' is not HOST:PORT or :PORT")
        }
        let host = address[..<colon].isEmpty ? "0.0.0.0" : String(address[..<colon])
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        socketAddress.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &socketAddress.sin_addr) == 1 else {
            throw UsageError("--http-listen: '\(host)' is not an IPv4 address")
        }
        let descriptor = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw UsageError("--http-listen: cannot open a socket (errno \(errno))") }
        var yes: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(descriptor, 128) == 0 else {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            throw UsageError("--http-listen: cannot listen on \(address): \(reason)")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        self.port = Int(UInt16(bigEndian: actual.sin_port))
        self.socket = descriptor
        self.handler = handler
    }

    /// Accepts on a thread of its own until ``stop()``.
    func start() {
        Thread.startNamed("encore.ops") { [self] in acceptLoop() }
    }

    /// Stops accepting (within 200 ms); connections being served finish.
    func stop() {
        stopping.store(true, ordering: .releasing)
    }

    /// A connection whose request is not complete yet.
    private struct Waiting {
        let connection: Int32
        let deadline: ContinuousClock.Instant
        var request: [UInt8] = []
    }

    private enum Reading {
        case waiting, closed, complete, tooLarge
    }

    private func acceptLoop() {
        var waiting: [Waiting] = []
        defer {
            for entry in waiting { close(entry.connection) }
            close(socket)
        }
        var buffer = [UInt8](repeating: 0, count: 2048)
        while !stopping.load(ordering: .acquiring) {
            var polled = [pollfd(fd: socket, events: Int16(POLLIN), revents: 0)]
            polled += waiting.map { pollfd(fd: $0.connection, events: Int16(POLLIN), revents: 0) }
            let now = ContinuousClock.now
            let nearest = waiting.map(\.deadline).min().map { max(.zero, $0 - now) } ?? .milliseconds(200)
            let wait = Int32(min(200, nearest.milliseconds + 1))
            _ = poll(&polled, nfds_t(polled.count), wait)
            // Requests first (before new connections can shed their senders), then the new ones.
            var kept: [Waiting] = []
            for (index, var entry) in waiting.enumerated() {
                let ready = polled[index + 1].revents != 0
                switch ready ? Self.read(into: &entry.request, from: entry.connection, buffer: &buffer) : .waiting {
                case .waiting where ContinuousClock.now < entry.deadline: kept.append(entry)
                case .waiting, .closed: close(entry.connection)  // Nothing in time: no answer is owed.
                case .tooLarge: answer(entry.connection, Response(status: 431, body: "request too large\n"))
                case .complete where Self.isProbe(entry.request):
                    // Health probes are answered here, outside the answer slots: small and quick,
                    // written without waiting (what does not fit at once is not owed to a client
                    // that does not read), so clients that fill the slots cannot fail a probe.
                    Self.write(respond(to: entry.request), to: entry.connection, until: .now)
                    close(entry.connection)
                case .complete: answer(entry.connection, request: entry.request)
                }
            }
            waiting = kept
            guard polled[0].revents != 0 else { continue }
            let connection = accept(socket, nil, nil)
            guard connection >= 0 else {
                // Out of descriptors: the listening socket stays readable, so make room instead of
                // spinning on it.
                if errno == EMFILE || errno == ENFILE {
                    if waiting.isEmpty { usleep(50_000) } else { close(waiting.removeFirst().connection) }
                }
                continue
            }
            if waiting.count >= Self.maximumWaitingConnections {
                // The oldest waited longest without sending a request: shed it for the newcomer.
                close(waiting.removeFirst().connection)
            }
            waiting.append(
                Waiting(connection: connection, deadline: .now.advanced(by: .seconds(Self.readTimeoutSeconds))))
        }
    }

    /// Reads what `connection` has sent so far without waiting.
    private static func read(into request: inout [UInt8], from connection: Int32, buffer: inout [UInt8]) -> Reading {
        while true {
            let count = recv(connection, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return .waiting }
            guard count > 0 else { return .closed }
            request += buffer.prefix(count)
            if request.count > maximumRequestBytes { return .tooLarge }
            let end = Array("\r\n\r\n".utf8)
            let from = max(0, request.count - count - 3)
            if request.count >= 4, (from...(request.count - 4)).contains(where: { Array(request[$0..<$0 + 4]) == end })
            {
                return .complete
            }
        }
    }

    /// Answers a complete request on a thread of its own, if one of ``maximumConnections`` is free.
    private func answer(_ connection: Int32, request: [UInt8]) {
        guard connections.add(1, ordering: .relaxed).newValue <= Self.maximumConnections else {
            connections.subtract(1, ordering: .relaxed)
            answer(connection, Response(status: 503, body: "busy\n"))
            return
        }
        // A serial queue per connection gets a thread at once (libdispatch's overcommitting pool):
        // a handler or a slow reader of the answer never holds up the reading of other requests.
        DispatchQueue(label: "encore.operations.connection").async { [self] in
            // One deadline for the whole answer: a client that reads slowly does not keep its slot.
            let response = respond(to: request)
            Self.write(response, to: connection, until: .now.advanced(by: .seconds(Self.readTimeoutSeconds)))
            // Its slot is free before its client sees the end: a client that connects again at
            // once is not refused as one too many.
            connections.subtract(1, ordering: .relaxed)
            close(connection)
        }
    }

    /// Answers on the accepting thread, without waiting for a client that does not read.
    private func answer(_ connection: Int32, _ response: Response) {
        Self.write(response, to: connection, until: .now)
        close(connection)
    }

    /// Whether `request` is a `GET` or `HEAD` of `/healthz` or `/readyz`.
    private static func isProbe(_ request: [UInt8]) -> Bool {
        let line = String(decoding: request.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self).split(separator: " ")
        guard line.count == 3, line[0] == "GET" || line[0] == "HEAD" else { return false }
        let path = line[1].prefix { $0 != "?" }
        return path == "/healthz" || path == "/readyz"
    }

    private func respond(to request: [UInt8]) -> Response {
        let line = String(decoding: request.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self).split(separator: " ")
        guard line.count == 3, line[2].hasPrefix("HTTP/1.") else { return Response(status: 400, body: "bad request\n") }
        guard line[0] == "GET" || line[0] == "HEAD" else { return Response(status: 405, body: "only GET\n") }
        var response = handler(String(line[1].prefix { $0 != "?" }))
        if line[0] == "HEAD" { response.body = "" }
        return response
    }

    /// Writes `response`, waiting for the client to read until `deadline` at most; then gives up.
    private static func write(_ response: Response, to connection: Int32, until deadline: ContinuousClock.Instant) {
        let reason =
            [
                200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large",
                503: "Service Unavailable",
            ][response.status] ?? "Status"
        let body = Array(response.body.utf8)
        var head = "HTTP/1.1 \(response.status) \(reason)\r\nContent-Type: \(response.contentType)\r\n"
        head += "Content-Length: \(body.count)\r\nConnection: close\r\n"
        if response.status == 405 { head += "Allow: GET, HEAD\r\n" }
        let bytes = Array((head + "\r\n").utf8) + body
        var sent = 0
        while sent < bytes.count {
            // (MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE for the process.)
            let written = bytes[sent...].withUnsafeBytes {
                Glibc.send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if written > 0 {
                sent += written
                continue
            }
            guard written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) else { return }
            let left = deadline - .now
            guard left > .zero else { return }
            var writable = pollfd(fd: connection, events: Int16(POLLOUT), revents: 0)
            _ = poll(&writable, 1, Int32(min(left.milliseconds + 1, 1000)))
        }
    }
}
