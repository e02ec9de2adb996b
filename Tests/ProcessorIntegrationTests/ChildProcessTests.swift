import Foundation
import Testing

/// The test support's child processes leave nothing behind in the temporary directory.
@Suite("Test support: child processes")
struct ChildProcessTests {
    @Test("a child's output files, its default state store and the files made beside it go with it")
    func directoryRemovedWithTheChild() async throws {
        var child: ChildProcess? = try ChildProcess(
            URL(fileURLWithPath: "/bin/sh"), ["-c", "echo hello; mkdir -p \"$ENCORE_STATE_DIR\""])
        let directory = child!.directory
        let status = await child!.waitForExit()
        #expect(status == 0)
        #expect(child!.stdout == "hello\n")
        #expect(FileManager.default.fileExists(atPath: directory.appendingPathComponent("state").path))
        child = nil
        #expect(!FileManager.default.fileExists(atPath: directory.path), "\(directory.path) is left behind")
    }
}
