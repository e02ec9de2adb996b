import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The process's CPU time and resident memory, from `/proc/self` (Linux), for `/metrics` and the
/// status page: what Prometheus' client libraries export as `process_*`.
struct ProcessResources: Sendable {
    var cpuSeconds: Double
    var residentBytes: Int
    var startTimeSeconds: Double
    var openDescriptors: Int

    /// Hands what the allocator holds freed back to the system: jemalloc's arenas are purged when
    /// jemalloc is the allocator (the Docker image preloads it), else glibc's `malloc_trim` runs,
    /// which would find nothing under jemalloc. Blocks while pages are returned.
    @discardableResult
    static func returnFreedMemory() -> FreedMemoryReturn {
        if let mallctl = jemallocControl {
            // MALLCTL_ARENAS_ALL (4096): every arena.
            let code = "arena.4096.purge".withCString { mallctl($0, nil, nil, nil, 0) }
            return code == 0 ? .jemallocPurged : .failed(code)
        }
        guard let trim = mallocTrim else { return .unavailable }
        _ = trim(0)
        return .glibcTrimmed
    }

    enum FreedMemoryReturn: Equatable, CustomStringConvertible {
        case jemallocPurged, glibcTrimmed
        /// Neither allocator's control was found.
        case unavailable
        /// jemalloc's `mallctl` answered this error code.
        case failed(Int32)

        var description: String {
            switch self {
            case .jemallocPurged: "jemalloc"
            case .glibcTrimmed: "glibc"
            case .unavailable: "none"
            case .failed(let code): "jemalloc (purge failed: \(code))"
            }
        }
    }

    private typealias Mallctl =
        @convention(c) (
            UnsafePointer<CChar>?, UnsafeMutableRawPointer?, UnsafeMutablePointer<Int>?, UnsafeMutableRawPointer?, Int
        ) -> Int32

    // Neither is in Swift's Glibc module: looked up once among the process's symbols (a null
    // handle is RTLD_DEFAULT).
    private static let jemallocControl: Mallctl? = {
        #if canImport(Glibc)
            dlsym(nil, "mallctl").map { unsafeBitCast($0, to: Mallctl.self) }
        #else
            nil
        #endif
    }()

    private static let mallocTrim: (@convention(c) (Int) -> Int32)? = {
        #if canImport(Glibc)
            dlsym(nil, "malloc_trim").map { unsafeBitCast($0, to: (@convention(c) (Int) -> Int32).self) }
        #else
            nil
        #endif
    }()

    /// Now; zeros where `/proc` cannot be read.
    static func current() -> ProcessResources {
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        var cpu = 0.0
        var startTicks = 0.0
        // Fields after the command name (which may hold spaces): state is field 3, utime 14,
        // stime 15, starttime 22.
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 19, let user = Double(fields[11]), let system = Double(fields[12]),
                let start = Double(fields[19])
            {
                cpu = (user + system) / ticks
                startTicks = start
            }
        }
        var resident = 0
        if let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) {
            let pages = statm.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
            resident = pages * Int(sysconf(Int32(_SC_PAGESIZE)))
        }
        var bootSeconds = 0.0
        if let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
            let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("btime ") })
        {
            bootSeconds = Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces)) ?? 0
        }
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
        return ProcessResources(
            cpuSeconds: cpu, residentBytes: resident,
            startTimeSeconds: bootSeconds > 0 ? bootSeconds + startTicks / ticks : 0, openDescriptors: descriptors)
    }
}
