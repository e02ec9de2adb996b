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

    /// Hands the memory glibc's allocator holds freed back to the system (`malloc_trim`): with a
    /// thread's arena per busy thread, freed blocks otherwise stay resident. A heap profile of a
    /// 2,000,000-user instance answering requests found 145 MB live at its peak and 305 MB resident.
    static func returnFreedMemory() {
        if let trim = mallocTrim { _ = trim(0) }
    }

    /// glibc's `malloc_trim` (not in Swift's Glibc module), looked up once; `nil` elsewhere.
    private static let mallocTrim: (@convention(c) (Int) -> Int32)? = {
        #if canImport(Glibc)
            // (A null handle is RTLD_DEFAULT: the process's own symbols.)
            guard let symbol = dlsym(nil, "malloc_trim") else { return nil }
            return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)
        #else
            return nil
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
