// SluiceURLSession.swift — URLSession calls to sluice with every attempt
// signed: SluiceClient signs, sends, and on a retryable answer (429, 408,
// 409, 5xx, or `x-should-retry: true`) waits as the answer asks
// (retry-after-ms, Retry-After) and sends again with a NEW signature.
// sluice uses a nonce up even when it answers 429, so re-sending the first
// attempt's headers would be refused as signature_replay.
//
// For code that sends its own URLRequests: `SluiceSigner.signed(request, ...)`
// returns a signed copy — call it once per attempt, never reuse its result.

import Foundation

/// What the app holds: the bearer token and its signing key, as POST
/// /v1/auth/token returns them (called by the app's backend, never the app).
public struct SluiceCredentials: Sendable {
    public let accessToken: String
    public let signingKey: String
    public init(accessToken: String, signingKey: String) {
        self.accessToken = accessToken
        self.signingKey = signingKey
    }
}

public protocol SluiceTokenProvider: AnyObject {
    /// The token to use now; called once per attempt (cache it).
    func credentials() async throws -> SluiceCredentials
    /// sluice refused the token (401 invalid_token: expired, revoked).
    func invalidate() async
}

public enum SluiceError: Error {
    /// httpBodyStream cannot be hashed before it is sent: set httpBody.
    case streamedBody
    case notHTTP
}

extension SluiceSigner {
    /// A copy of `request` with the token and a fresh signature over its
    /// httpBody. One call per attempt.
    public static func signed(_ request: URLRequest, credentials: SluiceCredentials,
                              now: Date = Date()) throws -> URLRequest {
        if request.httpBodyStream != nil { throw SluiceError.streamedBody }
        guard let url = request.url else { throw SluiceError.notHTTP }
        let method = request.httpMethod ?? "GET"
        let sig = sign(signingKey: credentials.signingKey, method: method,
                       pathWithQuery: pathWithQuery(url), body: request.httpBody ?? Data(), now: now)
        var r = request
        r.setValue("Bearer " + credentials.accessToken, forHTTPHeaderField: "Authorization")
        r.setValue(sig.timestamp, forHTTPHeaderField: headerTimestamp)
        r.setValue(sig.nonce, forHTTPHeaderField: headerNonce)
        r.setValue(sig.signature, forHTTPHeaderField: headerSignature)
        return r
    }
}

public final class SluiceClient {
    private let session: URLSession
    private let tokens: SluiceTokenProvider
    private let maxRetries: Int

    public init(session: URLSession = .shared, tokens: SluiceTokenProvider, maxRetries: Int = 2) {
        self.session = session
        self.tokens = tokens
        self.maxRetries = maxRetries
    }

    /// The whole answer; retries as the OpenAI SDKs do, each attempt signed afresh.
    public func data(for request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        var attempt = 0
        while true {
            let creds = try await tokens.credentials()
            let signed = try SluiceSigner.signed(request, credentials: creds) // fresh per attempt
            let (data, response) = try await session.data(for: signed)
            guard let http = response as? HTTPURLResponse else { throw SluiceError.notHTTP }
            await noteRefusal(http)
            if attempt < maxRetries, let delay = SluiceClient.retryDelay(http, attempt: attempt) {
                attempt += 1
                try await Task.sleep(nanoseconds: UInt64(delay * 1_000_000_000))
                continue
            }
            return (data, http)
        }
    }

    /// A stream (SSE): bytes as they arrive. Retries only before the body is
    /// read (a refused attempt's body is dropped), each attempt signed afresh.
    public func bytes(for request: URLRequest) async throws -> (URLSession.AsyncBytes, HTTPURLResponse) {
        var attempt = 0
        while true {
            let creds = try await tokens.credentials()
            let signed = try SluiceSigner.signed(request, credentials: creds) // fresh per attempt
            let (bytes, response) = try await session.bytes(for: signed)
            guard let http = response as? HTTPURLResponse else { throw SluiceError.notHTTP }
            await noteRefusal(http)
            if attempt < maxRetries, let delay = SluiceClient.retryDelay(http, attempt: attempt) {
                bytes.task.cancel()
                attempt += 1
                try await Task.sleep(nanoseconds: UInt64(delay * 1_000_000_000))
                continue
            }
            return (bytes, http)
        }
    }

    private func noteRefusal(_ http: HTTPURLResponse) async {
        let wa = http.value(forHTTPHeaderField: "WWW-Authenticate") ?? ""
        if http.statusCode == 401 && wa.contains("error=\"invalid_token\"") {
            await tokens.invalidate()
        }
    }

    /// Seconds to wait before retrying `http`, or nil when it is not retried:
    /// the OpenAI SDKs' rule (x-should-retry first; then 408, 409, 429, 5xx),
    /// delay from retry-after-ms, then Retry-After (seconds or an HTTP date),
    /// else 0.5 s doubling per attempt (at most 8 s) with up to 25 % jitter.
    public static func retryDelay(_ http: HTTPURLResponse, attempt: Int) -> TimeInterval? {
        switch http.value(forHTTPHeaderField: "x-should-retry") {
        case "true": break
        case "false": return nil
        default:
            let s = http.statusCode
            guard s == 408 || s == 409 || s == 429 || s >= 500 else { return nil }
        }
        if let ms = http.value(forHTTPHeaderField: "retry-after-ms").flatMap({ Double($0) }), ms >= 0, ms < 60_000 {
            return ms / 1000
        }
        if let ra = http.value(forHTTPHeaderField: "Retry-After") {
            if let s = Double(ra), s >= 0, s < 60 { return s }
            let f = DateFormatter()
            f.locale = Locale(identifier: "en_US_POSIX")
            f.timeZone = TimeZone(identifier: "GMT")
            f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
            if let d = f.date(from: ra) {
                let s = d.timeIntervalSinceNow
                if s >= 0 && s < 60 { return s }
            }
        }
        let base = min(0.5 * pow(2.0, Double(attempt)), 8.0)
        return base * (1 - Double.random(in: 0..<0.25))
    }
}
