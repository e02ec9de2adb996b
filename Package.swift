// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "encore-processor",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Kafka", targets: ["Kafka"]),
        .library(name: "EncoreEvents", targets: ["EncoreEvents"]),
        .library(name: "EncoreProcessor", targets: ["EncoreProcessor"]),
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
        .executableTarget(name: "encore-processor", dependencies: ["EncoreProcessor", "Kafka", "EncoreEvents"]),
        .testTarget(name: "KafkaTests", dependencies: ["Kafka"]),
        .testTarget(name: "EncoreEventsTests", dependencies: ["EncoreEvents"]),
    ],
    swiftLanguageModes: [.v6]
)
