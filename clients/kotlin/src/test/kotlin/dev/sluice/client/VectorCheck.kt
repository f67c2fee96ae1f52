/*
 * VectorCheck.kt — a harness for tests/integration/test_client_kits.py: reads
 * lines of space-separated base64 fields (key, method, path, timestamp,
 * nonce, body) and prints, for each, base64(canonical) and the signature
 * SluiceSigner computes; then one fresh signature's timestamp and nonce.
 */
package dev.sluice.client

import java.io.File
import java.util.Base64

fun main(args: Array<String>) {
    val dec = Base64.getDecoder()
    val enc = Base64.getEncoder()
    for (line in File(args[0]).readLines()) {
        if (line.isBlank()) continue
        val f = line.split(" ").map { dec.decode(it) }
        val s = SluiceSigner.signWith(String(f[0], Charsets.UTF_8), String(f[1], Charsets.UTF_8),
                                      String(f[2], Charsets.UTF_8), f[5], String(f[3], Charsets.UTF_8),
                                      String(f[4], Charsets.UTF_8))
        println(enc.encodeToString(s.canonical.toByteArray(Charsets.UTF_8)) + " " + s.signature)
    }
    val fresh = SluiceSigner.sign("k", "GET", "/v1/models", ByteArray(0))
    println("fresh " + fresh.timestamp + " " + fresh.nonce)
}
