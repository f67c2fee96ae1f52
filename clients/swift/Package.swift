// swift-tools-version:5.7
// SluiceKit: request signing for the sluice gateway (URLSession helper).
import PackageDescription

let package = Package(
    name: "SluiceKit",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [.library(name: "SluiceKit", targets: ["SluiceKit"])],
    targets: [.target(name: "SluiceKit", path: "Sources/SluiceKit")]
)
