// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "encore-processor",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Kafka", targets: ["Kafka"]),
        .library(name: "EncoreEvents", targets: ["EncoreEvents"]),
        .library(name: "EncoreProcessor", targets: ["EncoreProcessor"]),
        .library(name: "EncoreTools", targets: ["EncoreTools"]),
        .executable(name: "encore-processor", targets: ["encore-processor"]),
    ],
    targets: [
        .systemLibrary(
            name: "CRdKafka",
            pkgConfig: "rdkafka",
            providers: [.apt(["librdkafka-dev"])]
        ),
        // OpenSSL's libcrypto: the HMAC that signs calls to an http controller (Debian's libssl-dev).
        .systemLibrary(name: "COpenSSL", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // zlib: the compressed histograms of `loadtest --hdr` (HdrHistogram's log format; Debian's zlib1g-dev).
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        // RocksDB: the local state store under --state-dir (Debian's librocksdb-dev).
        .systemLibrary(name: "CRocksDB", pkgConfig: "rocksdb", providers: [.apt(["librocksdb-dev"])]),
        .target(name: "Kafka", dependencies: ["CRdKafka"]),
        .target(name: "EncoreEvents"),
        .target(name: "EncoreProcessor", dependencies: ["Kafka", "EncoreEvents", "COpenSSL", "CRocksDB"]),
        .target(name: "EncoreTools", dependencies: ["EncoreProcessor", "Kafka", "EncoreEvents", "CZlib"]),
        .executableTarget(
            name: "encore-processor", dependencies: ["EncoreTools", "EncoreProcessor", "Kafka", "EncoreEvents"]),
        // What test targets share: waiting for conditions, an embedded cluster, a recording controller.
        .target(name: "TestSupport", dependencies: ["Kafka", "EncoreProcessor"], path: "Tests/TestSupport"),
        .testTarget(name: "KafkaTests", dependencies: ["Kafka", "TestSupport"]),
        .testTarget(name: "EncoreEventsTests", dependencies: ["EncoreEvents"]),
        .testTarget(name: "EncoreToolsTests", dependencies: ["EncoreTools", "EncoreProcessor", "EncoreEvents", "Kafka"]),
        .testTarget(
            name: "EncoreProcessorTests",
            dependencies: ["EncoreProcessor", "EncoreTools", "Kafka", "EncoreEvents", "TestSupport"]),
        .testTarget(
            name: "ProcessorIntegrationTests",
            dependencies: ["EncoreProcessor", "EncoreTools", "Kafka", "EncoreEvents", "encore-processor", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
