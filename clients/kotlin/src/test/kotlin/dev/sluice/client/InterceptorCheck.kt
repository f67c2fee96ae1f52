/*
 * InterceptorCheck.kt — a harness for tests/integration/test_client_kits.py:
 * SluiceSigningInterceptor in a real OkHttp client against the real sluice.
 *
 * Debian 12 ships OkHttp 3 (Java API: request.url(), response.code()), the
 * kit targets OkHttp 4 (Kotlin properties), so the test compiles this file
 * with a copy of the interceptor rewritten to the OkHttp 3 spelling (a few
 * mechanical replacements it lists); this file is written against OkHttp 3.
 *
 *   InterceptorCheck BASE_URL CLIENT_ID CLIENT_SECRET SUB PROMPT MAX_RETRIES
 *
 * Mints a token at POST /v1/auth/token, then posts one chat request and
 * retries it on 429 by executing the call again (as SDKs on OkHttp do).
 * Prints "attempt STATUS NONCE" per attempt on the wire (a second network
 * interceptor, after the kit's, records them), then "final STATUS BODY".
 */
package dev.sluice.client

import okhttp3.Interceptor
import okhttp3.MediaType
import okhttp3.OkHttpClient
import okhttp3.Request
import okhttp3.RequestBody

private val JSON = MediaType.get("application/json")

private fun field(json: String, name: String): String =
    Regex("\"" + name + "\"\\s*:\\s*\"([^\"]*)\"").find(json)?.groupValues?.get(1)
        ?: throw IllegalStateException("no $name in $json")

class EndpointTokens(private val http: OkHttpClient, private val base: String, private val body: String) : SluiceTokenProvider {
    @Volatile private var cached: SluiceCredentials? = null
    var mints = 0

    override fun current(): SluiceCredentials {
        cached?.let { return it }
        val req = Request.Builder().url("$base/v1/auth/token").post(RequestBody.create(JSON, body)).build()
        http.newCall(req).execute().use { r ->
            val text = r.body()!!.string()
            if (r.code() != 200) throw IllegalStateException("token endpoint: ${r.code()} $text")
            mints++
            return SluiceCredentials(field(text, "access_token"), field(text, "signing_key")).also { cached = it }
        }
    }

    override fun invalidate() {
        cached = null
    }
}

fun main(args: Array<String>) {
    val base = args[0]
    val plain = OkHttpClient()
    val tokenBody = "{\"client_id\":\"${args[1]}\",\"client_secret\":\"${args[2]}\",\"sub\":\"${args[3]}\"}"
    val tokens = EndpointTokens(plain, base, tokenBody)
    val record = Interceptor { chain ->
        val resp = chain.proceed(chain.request())
        println("attempt " + resp.code() + " " + chain.request().header(SluiceSigner.HEADER_NONCE))
        resp
    }
    val client = OkHttpClient.Builder()
        .addNetworkInterceptor(SluiceSigningInterceptor(tokens))
        .addNetworkInterceptor(record)
        .build()
    val chat = "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"user\",\"content\":\"${args[4]}\"}]}"
    val maxRetries = args[5].toInt()
    var attempt = 0
    while (true) {
        val req = Request.Builder().url("$base/v1/chat/completions").post(RequestBody.create(JSON, chat)).build()
        client.newCall(req).execute().use { r ->
            val text = r.body()!!.string()
            if (r.code() == 429 && attempt < maxRetries) {
                attempt++
            } else {
                println("final " + r.code() + " " + text.replace("\n", " "))
                println("mints " + tokens.mints)
                return
            }
        }
    }
}
