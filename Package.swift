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
        .target(name: "Kafka", dependencies: ["CRdKafka"]),
        .target(name: "EncoreEvents"),
        .target(name: "EncoreProcessor", dependencies: ["Kafka", "EncoreEvents"]),
        .target(name: "EncoreTools", dependencies: ["EncoreProcessor", "Kafka", "EncoreEvents"]),
        .executableTarget(
            name: "encore-processor", dependencies: ["EncoreTools", "EncoreProcessor", "Kafka", "EncoreEvents"]),
        .testTarget(name: "KafkaTests", dependencies: ["Kafka"]),
        .testTarget(name: "EncoreEventsTests", dependencies: ["EncoreEvents"]),
        .testTarget(name: "EncoreToolsTests", dependencies: ["EncoreTools", "EncoreEvents"]),
        .testTarget(name: "EncoreProcessorTests", dependencies: ["EncoreProcessor", "EncoreTools", "Kafka", "EncoreEvents"]),
        .testTarget(
            name: "ProcessorIntegrationTests",
            dependencies: ["EncoreProcessor", "EncoreTools", "Kafka", "EncoreEvents", "encore-processor"]),
    ],
    swiftLanguageModes: [.v6]
)
