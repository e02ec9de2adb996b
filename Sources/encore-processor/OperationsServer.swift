import Foundation
import Kafka
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A small GET-only HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`: one accept thread,
/// at most ``maximumConnections`` served at once (others get 503), a read timeout, requests of at
/// most ``maximumRequestBytes``, and every connection closed after its answer.
final class OperationsServer: Sendable {
    struct Response: Sendable {
        var status: Int
        var contentType = "text/plain; charset=utf-8"
        var body: String
    }

    static let maximumConnections = 8
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
        guard bound == 0, listen(descriptor, 64) == 0 else {
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
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "encore.operations"
        thread.start()
    }

    /// Stops accepting (within 200 ms); connections being served finish.
    func stop() {
        stopping.store(true, ordering: .releasing)
    }

    private func acceptLoop() {
        defer { close(socket) }
        while !stopping.load(ordering: .acquiring) {
            var waiting = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            guard poll(&waiting, 1, 200) > 0 else { continue }
            let connection = accept(socket, nil, nil)
            guard connection >= 0 else { continue }
            var timeout = timeval(tv_sec: Self.readTimeoutSeconds, tv_usec: 0)
            setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            guard connections.add(1, ordering: .relaxed).newValue <= Self.maximumConnections else {
                connections.subtract(1, ordering: .relaxed)
                Self.write(Response(status: 503, body: "busy\n"), to: connection)
                close(connection)
                continue
            }
            // A serial queue per connection gets a thread at once (libdispatch's overcommitting
            // pool): a shared concurrent queue served as many as there are cores, and clients
            // that send nothing held up health checks until their read timeout.
            DispatchQueue(label: "encore.operations.connection").async { [self] in
                serve(connection)
                // Its slot is free before its client sees the end: a client that connects again at
                // once is not refused as one too many.
                connections.subtract(1, ordering: .relaxed)
                close(connection)
            }
        }
    }

    private func serve(_ connection: Int32) {
        // One deadline for the whole request, not only per read: a client trickling bytes does
        // not keep its slot (the cap is small).
        let deadline = ContinuousClock.now.advanced(by: .seconds(Self.readTimeoutSeconds))
        var request = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 2048)
        let end = Array("\r\n\r\n".utf8)
        while true {
            let count = read(connection, &buffer, buffer.count)
            // Closed, or nothing within the read timeout: no answer is owed.
            guard count > 0, ContinuousClock.now < deadline else { return }
            request += buffer.prefix(count)
            if request.count > Self.maximumRequestBytes {
                Self.write(Response(status: 431, body: "request too large\n"), to: connection)
                return
            }
            if let _ = request.indices.dropLast(3).first(where: { Array(request[$0..<$0 + 4]) == end }) { break }
        }
        let line = String(decoding: request.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self).split(separator: " ")
        guard line.count == 3, line[2].hasPrefix("HTTP/1.") else {
            Self.write(Response(status: 400, body: "bad request\n"), to: connection)
            return
        }
        guard line[0] == "GET" || line[0] == "HEAD" else {
            Self.write(Response(status: 405, body: "only GET\n"), to: connection)
            return
        }
        let path = String(line[1].prefix { $0 != "?" })
        var response = handler(path)
        if line[0] == "HEAD" { response.body = "" }
        Self.write(response, to: connection)
    }

    private static func write(_ response: Response, to connection: Int32) {
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
                Glibc.send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard written > 0 else { return }
            sent += written
        }
    }
}
