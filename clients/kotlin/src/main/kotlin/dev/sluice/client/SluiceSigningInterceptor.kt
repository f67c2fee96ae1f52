/*
 * SluiceSigningInterceptor.kt — an OkHttp (4.x / 5.x) interceptor that signs
 * every request for sluice with SluiceSigner.
 *
 * Install it as a NETWORK interceptor (OkHttpClient.Builder
 * .addNetworkInterceptor): those run once per attempt that goes on the wire,
 * so OkHttp's own silent retries and redirect follow-ups are signed afresh
 * too. An SDK that retries by executing the call again (a 429, a 5xx) goes
 * through it again either way. sluice uses a nonce up even when it answers
 * 429, so a retry that reused the first attempt's headers would be refused
 * as signature_replay.
 */
package dev.sluice.client

import okhttp3.Interceptor
import okhttp3.Request
import okhttp3.RequestBody.Companion.toRequestBody
import okhttp3.Response
import okio.Buffer

/** What the app holds: the bearer token and its signing key, as POST
 * /v1/auth/token returns them (called by the app's backend, never the app). */
class SluiceCredentials(val accessToken: String, val signingKey: String)

interface SluiceTokenProvider {
    /** The token to use now; called once per attempt (cache it). Runs on
     * OkHttp's threads, so it may block to mint a new one. */
    fun current(): SluiceCredentials

    /** sluice refused the token (401 invalid_token: expired, revoked):
     * mint a new one for the next attempt. */
    fun invalidate() {}
}

class SluiceSigningInterceptor(
    private val tokens: SluiceTokenProvider,
    private val clock: () -> Long = { System.currentTimeMillis() }
) : Interceptor {
    override fun intercept(chain: Interceptor.Chain): Response {
        val request = chain.request()
        val creds = tokens.current()
        val signed = sign(request, creds)
        val response = chain.proceed(signed)
        if (response.code == 401 &&
            (response.header("WWW-Authenticate") ?: "").contains("error=\"invalid_token\"")) {
            tokens.invalidate()
        }
        return response
    }

    /** The request with a fresh signature over the exact bytes it sends. */
    private fun sign(request: Request, creds: SluiceCredentials): Request {
        val body = request.body
        // A body is read once here and sent as those same bytes: the hash and
        // the wire cannot differ, and a one-shot body is not read twice.
        val bytes = if (body == null) ByteArray(0) else Buffer().also { body.writeTo(it) }.readByteArray()
        val url = request.url
        // The request line OkHttp writes: encoded path, then "?" + encoded query if any.
        val pathWithQuery = url.encodedPath + (url.encodedQuery?.let { "?$it" } ?: "")
        val sig = SluiceSigner.sign(creds.signingKey, request.method, pathWithQuery, bytes, clock())
        val builder = request.newBuilder()
            .header("Authorization", "Bearer " + creds.accessToken)
            .header(SluiceSigner.HEADER_TIMESTAMP, sig.timestamp)
            .header(SluiceSigner.HEADER_NONCE, sig.nonce)
            .header(SluiceSigner.HEADER_SIGNATURE, sig.signature)
        if (body != null) builder.method(request.method, bytes.toRequestBody(body.contentType()))
        return builder.build()
    }
}
