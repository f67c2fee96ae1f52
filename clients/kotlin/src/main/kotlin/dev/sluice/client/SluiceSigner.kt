/*
 * SluiceSigner.kt — the request signature sluice checks (docs/auth.md,
 * auth/auth_sig.c), for Android/JVM apps. Pure: JDK crypto only, no OkHttp,
 * so that it compiles with any Kotlin and is checked against
 * clients/vectors.json (signatures made by `sluice sign`) by
 * tests/integration/test_client_kits.py.
 *
 * HMAC-SHA256 keyed with the signing key AS TEXT (its 64 hex characters as
 * UTF-8 bytes, never hex-decoded) over five lines joined by "\n", no
 * trailing newline:  METHOD, PATH_WITH_QUERY, TIMESTAMP, NONCE, hex(SHA-256(body)).
 * A nonce is accepted once per token, so every attempt — retries included —
 * needs a fresh timestamp, nonce and signature: sign in the per-attempt path.
 */
package dev.sluice.client

import java.security.MessageDigest
import java.security.SecureRandom
import javax.crypto.Mac
import javax.crypto.spec.SecretKeySpec

class SluiceSignature(val timestamp: String, val nonce: String, val signature: String, val canonical: String)

object SluiceSigner {
    const val HEADER_TIMESTAMP = "X-Sluice-Timestamp"
    const val HEADER_NONCE = "X-Sluice-Nonce"
    const val HEADER_SIGNATURE = "X-Sluice-Signature"

    private val random = SecureRandom()
    private val hexDigits = "0123456789abcdef".toCharArray()

    /** Lowercase hex, as sluice compares it. */
    fun hex(b: ByteArray): String {
        val out = CharArray(b.size * 2)
        for (i in b.indices) {
            val v = b[i].toInt() and 0xff
            out[2 * i] = hexDigits[v ushr 4]
            out[2 * i + 1] = hexDigits[v and 15]
        }
        return String(out)
    }

    fun canonical(method: String, pathWithQuery: String, timestamp: String, nonce: String, bodySha256Hex: String): String =
        method + "\n" + pathWithQuery + "\n" + timestamp + "\n" + nonce + "\n" + bodySha256Hex

    /** 16 random bytes as 32 hex characters (sluice takes 16..64 of [A-Za-z0-9_-]). */
    fun newNonce(): String {
        val b = ByteArray(16)
        random.nextBytes(b)
        return hex(b)
    }

    /** Deterministic: the given timestamp and nonce (the vectors use this). */
    fun signWith(signingKey: String, method: String, pathWithQuery: String, body: ByteArray,
                 timestamp: String, nonce: String): SluiceSignature {
        val bodyHash = hex(MessageDigest.getInstance("SHA-256").digest(body))
        val c = canonical(method, pathWithQuery, timestamp, nonce, bodyHash)
        val mac = Mac.getInstance("HmacSHA256")
        mac.init(SecretKeySpec(signingKey.toByteArray(Charsets.UTF_8), "HmacSHA256"))
        return SluiceSignature(timestamp, nonce, hex(mac.doFinal(c.toByteArray(Charsets.UTF_8))), c)
    }

    /** A fresh signature for one attempt: now's timestamp, a new nonce. */
    fun sign(signingKey: String, method: String, pathWithQuery: String, body: ByteArray,
             nowMillis: Long = System.currentTimeMillis()): SluiceSignature =
        signWith(signingKey, method, pathWithQuery, body, (nowMillis / 1000).toString(), newNonce())
}
