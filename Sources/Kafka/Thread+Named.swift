import Foundation

extension Thread {
    /// Starts a thread that runs `body`, named `name` where operators look: `top -H`, `perf`,
    /// `/proc/PID/task/TID/comm`. Foundation's `Thread.name`, set before `start()`, never reaches
    /// the kernel on Linux, and set by the thread it missed about one start in thirty (and
    /// Glibc's module does not export `pthread_setname_np`): the thread writes its kernel name
    /// itself, first. `name` is ASCII of at most 15 bytes, the kernel's limit.
    @discardableResult
    package static func startNamed(_ name: String, _ body: @escaping @Sendable () -> Void) -> Thread {
        precondition(name.utf8.count <= 15 && name.allSatisfy(\.isASCII), "thread name '\(name)': ASCII, 15 bytes")
        let thread = Thread {
            let comm = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
            if comm >= 0 {
                let bytes = Array(name.utf8)
                _ = write(comm, bytes, bytes.count)
                close(comm)
            }
            body()
        }
        thread.start()
        return thread
    }
}
