// kit_client.mjs — drives sluice with signing required through the client
// kit's signingFetch (clients/typescript, compiled by the test), under the
// official `openai` package and the Vercel AI SDK, for
// tests/integration/test_client_kits.py. Prints one JSON line: what the
// client got, and every HTTP attempt that left the process (status, the
// nonce it carried, the SDK's retry count) so the test can count them.
//
//   node kit_client.mjs KIT_DIST BASE_URL MODE
//   MODE: openai-chat | openai-stream | ai-chat | ai-stream   (maxRetries from $KIT_MAX_RETRIES)
//         naive-chat: the same SDK retry with headers signed once (no kit)
//         vectors FILE: the kit's core over clients/vectors.json
// The token comes from POST /v1/auth/token ($KIT_CLIENT_ID, $KIT_CLIENT_SECRET,
// $KIT_SUB), standing in for the app's backend.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [kitDist, baseURL, mode, arg] = process.argv.slice(2);
const kit = await import(pathToFileURL(path.join(kitDist, "index.js")).href);
const maxRetries = Number(process.env.KIT_MAX_RETRIES ?? "2");
const messages = [{ role: "user", content: process.env.KIT_PROMPT ?? "hello from the kit" }];

// The fetch under the kit: records each attempt as it leaves.
const attempts = [];
async function recordingFetch(url, init) {
  const h = new Headers(init?.headers);
  const rec = {
    path: new URL(String(url)).pathname,
    nonce: h.get("x-sluice-nonce"),
    timestamp: h.get("x-sluice-timestamp"),
    retry_count: h.get("x-stainless-retry-count"),
    status: null,
  };
  attempts.push(rec);
  const r = await fetch(url, init);
  rec.status = r.status;
  return r;
}

function tokenSource() {
  const mint = kit.sluiceTokenEndpoint(baseURL + "/v1/auth/token", {
    clientId: process.env.KIT_CLIENT_ID,
    clientSecret: process.env.KIT_CLIENT_SECRET,
    sub: process.env.KIT_SUB ?? "alice",
  });
  return kit.cachedTokenSource(mint);
}

function openaiError(e) {
  return { name: e.constructor.name, status: e.status ?? null, code: e.code ?? null, message: String(e.message) };
}

async function openaiClient(fetchImpl) {
  const { default: OpenAI } = await import("openai");
  return new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused-sluice-takes-the-token", maxRetries, timeout: 20000, fetch: fetchImpl });
}

async function aiProvider() {
  const { createOpenAI } = await import("@ai-sdk/openai");
  return createOpenAI({
    baseURL: baseURL + "/v1",
    apiKey: "unused-sluice-takes-the-token",
    fetch: kit.signingFetch({ tokens: tokenSource(), fetch: recordingFetch }),
  });
}

function aiError(e) {
  const last = e.lastError ?? e;
  return { name: e.constructor.name, status: last.statusCode ?? null, body: last.responseBody ?? null, message: String(e.message) };
}

async function main() {
  switch (mode) {
    case "openai-chat": {
      const client = await openaiClient(kit.signingFetch({ tokens: tokenSource(), fetch: recordingFetch }));
      try {
        const r = await client.chat.completions.create({ model: "chat-model", messages });
        return { text: r.choices[0].message.content, error: null };
      } catch (e) {
        return { text: null, error: openaiError(e) };
      }
    }
    case "openai-stream": {
      const client = await openaiClient(kit.signingFetch({ tokens: tokenSource(), fetch: recordingFetch }));
      const out = { text: "", chunks: 0, error: null };
      try {
        const stream = await client.chat.completions.create({ model: "chat-model", messages, stream: true });
        for await (const chunk of stream) {
          out.chunks += 1;
          out.text += chunk.choices?.[0]?.delta?.content ?? "";
        }
      } catch (e) {
        out.error = openaiError(e);
      }
      return out;
    }
    case "naive-chat": {
      // What an app does without the kit: sign the request once, hand the
      // headers to the SDK, and let the SDK retry with those same headers.
      const tok = await tokenSource().get();
      const params = { model: "chat-model", messages };
      const crypto = await kit.sluiceDefaultCrypto();
      const body = new TextEncoder().encode(JSON.stringify(params)); // what the SDK sends
      const sig = await kit.sluiceSign(crypto, tok.signingKey, "POST", "/v1/chat/completions", body, Date.now());
      const client = await openaiClient(recordingFetch);
      const headers = {
        Authorization: "Bearer " + tok.accessToken,
        [kit.SLUICE_HEADER_TIMESTAMP]: sig.timestamp,
        [kit.SLUICE_HEADER_NONCE]: sig.nonce,
        [kit.SLUICE_HEADER_SIGNATURE]: sig.signature,
      };
      try {
        const r = await client.chat.completions.create(params, { headers });
        return { text: r.choices[0].message.content, error: null };
      } catch (e) {
        return { text: null, error: openaiError(e) };
      }
    }
    case "ai-chat": {
      const { generateText } = await import("ai");
      const openai = await aiProvider();
      try {
        const r = await generateText({ model: openai.chat("chat-model"), messages, maxRetries });
        return { text: r.text, error: null };
      } catch (e) {
        return { text: null, error: aiError(e) };
      }
    }
    case "ai-stream": {
      const { streamText } = await import("ai");
      const openai = await aiProvider();
      const out = { text: "", chunks: 0, error: null };
      const r = streamText({
        model: openai.chat("chat-model"),
        messages,
        maxRetries,
        onError: ({ error }) => {
          out.error = aiError(error);
        },
      });
      for await (const part of r.textStream) {
        out.chunks += 1;
        out.text += part;
      }
      return out;
    }
    case "vectors": {
      const doc = JSON.parse(readFileSync(arg, "utf8"));
      const crypto = await kit.sluiceDefaultCrypto();
      const results = [];
      for (const v of doc.vectors) {
        const body = new Uint8Array(Buffer.from(v.body_b64, "base64"));
        const s = await kit.sluiceSignWith(crypto, v.key, v.method, v.path, body, v.timestamp, v.nonce);
        results.push({ name: v.name, canonical: s.canonical, signature: s.signature });
      }
      const fresh = await kit.sluiceSign(crypto, doc.vectors[0].key, "GET", "/v1/models", new Uint8Array(0), Date.now());
      return {
        results,
        headers: [kit.SLUICE_HEADER_TIMESTAMP, kit.SLUICE_HEADER_NONCE, kit.SLUICE_HEADER_SIGNATURE],
        fresh: { timestamp: fresh.timestamp, nonce: fresh.nonce },
        paths: ["http://h:1/v1/chat/completions", "http://h/v1/x?", "http://u:p@h/v1/x?a=1&b=%20#frag?", "http://h/v1/a b?q=é"].map(
          (u) => [u, kit.sluicePathWithQuery(u)],
        ),
      };
    }
    case "shapes": {
      // signingFetch over every body and input shape, against a local server
      // that records what arrived (the test checks each signature in Python),
      // and the token cache: one mint for parallel calls, a new one after a
      // 401 invalid_token and near expiry.
      const http = await import("node:http");
      const seen = [];
      const server = http.createServer((req, res) => {
        const parts = [];
        req.on("data", (c) => parts.push(c));
        req.on("end", () => {
          seen.push({ method: req.method, target: req.url, headers: req.headers, body_b64: Buffer.concat(parts).toString("base64") });
          if (req.url.startsWith("/v1/expired")) {
            res.writeHead(401, { "WWW-Authenticate": 'Bearer realm="sluice", error="invalid_token", error_description="token_expired"' });
            res.end("{}");
          } else {
            res.writeHead(200, { "Content-Type": "application/json" });
            res.end("{}");
          }
        });
      });
      await new Promise((r) => server.listen(0, "127.0.0.1", r));
      const base = `http://127.0.0.1:${server.address().port}`;
      const key = arg;
      let mints = 0;
      let clock = 1_000_000_000_000;
      const tokens = kit.cachedTokenSource(async () => {
        mints += 1;
        await new Promise((r) => setTimeout(r, 20)); // parallel callers must share this one
        return { access_token: "tok-" + mints, signing_key: key, expires_in: 100 };
      }, { now: () => clock });
      const f = kit.signingFetch({ tokens });
      const form = new FormData();
      form.append("purpose", "fine-tune");
      form.append("file", new Blob(["line one\nline two\n"], { type: "text/plain" }), "data.jsonl");
      const stream = new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode('{"streamed":'));
          c.enqueue(new TextEncoder().encode("true}"));
          c.close();
        },
      });
      const shapes = [
        ["string", () => f(base + "/v1/chat/completions", { method: "POST", headers: { "Content-Type": "application/json" }, body: '{"a":"é"}' })],
        ["bytes", () => f(new URL(base + "/v1/embeddings?x=1&y=%20"), { method: "post", body: new Uint8Array([0, 1, 2, 255]) })],
        ["dataview", () => f(base + "/v1/embeddings", { method: "POST", body: new DataView(new Uint8Array([9, 8, 7, 6, 5]).buffer, 1, 3) })],
        ["blob", () => f(base + "/v1/files", { method: "POST", body: new Blob(["blob body"], { type: "text/plain" }) })],
        ["form", () => f(base + "/v1/files", { method: "POST", body: form })],
        ["params", () => f(base + "/v1/form", { method: "POST", body: new URLSearchParams({ a: "1", b: "x y" }) })],
        ["stream", () => f(base + "/v1/stream", { method: "POST", body: stream, duplex: "half" })],
        ["request", () => f(new Request(base + "/v1/chat/completions?q=1", { method: "POST", body: '{"r":1}', headers: { "Content-Type": "application/json" } }))],
        ["get", () => f(base + "/v1/models")],
      ];
      const names = [];
      for (const [name, call] of shapes) {
        await (await call()).text();
        names.push(name);
      }
      const mintsAfterShapes = mints;
      await Promise.all([1, 2, 3, 4, 5].map(() => f(base + "/v1/models").then((r) => r.text())));
      const mintsAfterParallel = mints;
      await (await f(base + "/v1/expired")).text(); // 401 invalid_token: the token is dropped
      await (await f(base + "/v1/models")).text();
      const mintsAfter401 = mints;
      clock += 30_000; // 70 s left: still fresh
      await (await f(base + "/v1/models")).text();
      const mintsAt30s = mints;
      clock += 20_000; // 50 s left, under the 60 s margin: minted again
      await (await f(base + "/v1/models")).text();
      server.close();
      return { names, seen, mints: [mintsAfterShapes, mintsAfterParallel, mintsAfter401, mintsAt30s, mints] };
    }
    default:
      throw new Error("unknown mode " + mode);
  }
}

main().then(
  (r) => {
    console.log(JSON.stringify({ ...r, attempts }));
  },
  (e) => {
    console.error(e);
    process.exit(2);
  },
);
