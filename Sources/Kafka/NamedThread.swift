import Foundation

extension Thread {
    /// Starts a thread that runs `body`, named `name` where operators look: `top -H`, `perf`,
    /// `/proc/PID/task/TID/comm` (the kernel keeps the first 15 bytes). Foundation's `Thread.name`,
    /// set before `start()`, never reaches the kernel on Linux, and set by the thread it missed
    /// about one start in thirty: the thread writes its kernel name itself, first.
    @discardableResult
    public static func startNamed(_ name: String, _ body: @escaping @Sendable () -> Void) -> Thread {
        let thread = Thread {
            let comm = open("/proc/thread-self/comm", O_WRONLY)
            if comm >= 0 {
                let bytes = Array(name.utf8.prefix(15))
                _ = write(comm, bytes, bytes.count)
                close(comm)
            }
            body()
        }
        thread.name = name
        thread.start()
        return thread
    }
}
