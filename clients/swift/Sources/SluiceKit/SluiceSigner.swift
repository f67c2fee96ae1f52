// SluiceSigner.swift — the request signature sluice checks (docs/auth.md,
// auth/auth_sig.c), for iOS/macOS apps. CryptoKit only.
//
// HMAC-SHA256 keyed with the signing key AS TEXT (its 64 hex characters as
// UTF-8 bytes, never hex-decoded) over five lines joined by "\n", no
// trailing newline: METHOD, PATH_WITH_QUERY, TIMESTAMP, NONCE,
// hex(SHA-256(body)). A nonce is accepted once per token, so every attempt
// of a request — retries included — needs a fresh timestamp, nonce and
// signature: SluiceClient (SluiceURLSession.swift) signs inside its retry loop.
//
// Debian has no Swift compiler, so tests/integration/test_client_kits.py
// checks this file's canonical string, key, hex and header names against
// clients/vectors.json's rules by reading it; keep `canonical` one line.

import CryptoKit
import Foundation

public struct SluiceSignature: Sendable {
    public let timestamp: String
    public let nonce: String
    public let signature: String
    public let canonical: String
}

public enum SluiceSigner {
    public static let headerTimestamp = "X-Sluice-Timestamp"
    public static let headerNonce = "X-Sluice-Nonce"
    public static let headerSignature = "X-Sluice-Signature"

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// Lowercase hex, as sluice compares it.
    public static func hex<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
        var out = [UInt8]()
        for b in bytes {
            out.append(hexDigits[Int(b >> 4)])
            out.append(hexDigits[Int(b & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func canonical(method: String, pathWithQuery: String, timestamp: String, nonce: String, bodySha256Hex: String) -> String {
        return [method, pathWithQuery, timestamp, nonce, bodySha256Hex].joined(separator: "\n")
    }

    /// 16 random bytes as 32 hex characters (sluice takes 16...64 of [A-Za-z0-9_-]).
    public static func newNonce() -> String {
        var rng = SystemRandomNumberGenerator()
        return hex((0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })
    }

    /// Deterministic: the given timestamp and nonce (what the vectors pin).
    public static func sign(signingKey: String, method: String, pathWithQuery: String, body: Data,
                            timestamp: String, nonce: String) -> SluiceSignature {
        let bodyHash = hex(SHA256.hash(data: body))
        let c = canonical(method: method, pathWithQuery: pathWithQuery, timestamp: timestamp, nonce: nonce, bodySha256Hex: bodyHash)
        let key = SymmetricKey(data: Data(signingKey.utf8))
        let mac = HMAC<SHA256>.authenticationCode(for: Data(c.utf8), using: key)
        return SluiceSignature(timestamp: timestamp, nonce: nonce, signature: hex(mac), canonical: c)
    }

    /// A fresh signature for one attempt: now's timestamp, a new nonce.
    public static func sign(signingKey: String, method: String, pathWithQuery: String, body: Data,
                            now: Date = Date()) -> SluiceSignature {
        let ts = String(Int64(now.timeIntervalSince1970.rounded(.down)))
        return sign(signingKey: signingKey, method: method, pathWithQuery: pathWithQuery, body: body,
                    timestamp: ts, nonce: newNonce())
    }

    /// The path and query as URLSession puts them on the request line
    /// (percent-encoded as in the URL; "/" for an empty path).
    public static func pathWithQuery(_ url: URL) -> String {
        guard let c = URLComponents(url: url, resolvingAgainstBaseURL: true) else { return url.path }
        var p = c.percentEncodedPath.isEmpty ? "/" : c.percentEncodedPath
        if let q = c.percentEncodedQuery { p += "?" + q }
        return p
    }
}
