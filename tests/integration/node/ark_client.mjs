// ark_client.mjs — runs clients/arkts/SluiceHttp.ets (compiled by the test
// with tsc, its @kit.NetworkKit import pointed at ark_stub_network.ts: the
// platform's `http` over Node's fetch) against the real sluice, for
// tests/integration/test_client_kits.py. Prints one JSON line: the answer
// SluiceHttpClient returned and every attempt the stub saw.
//
//   node ark_client.mjs ARK_DIST KIT_DIST BASE_URL PROMPT
// The token comes from POST /v1/auth/token ($KIT_CLIENT_ID, $KIT_CLIENT_SECRET,
// $KIT_SUB), standing in for the app's backend.
import path from "node:path";
import { pathToFileURL } from "node:url";

const [arkDist, kitDist, baseURL, prompt] = process.argv.slice(2);
const load = (dir, f) => import(pathToFileURL(path.join(dir, f)).href);
const ark = await load(arkDist, "SluiceHttp.js");
const { http } = await load(arkDist, "ark_stub_network.js");
const kit = await load(kitDist, "index.js");

class BackendTokens {
  constructor() {
    this.cached = null;
    this.mints = 0;
  }
  async get() {
    if (this.cached === null) {
      const r = await fetch(baseURL + "/v1/auth/token", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ client_id: process.env.KIT_CLIENT_ID, client_secret: process.env.KIT_CLIENT_SECRET, sub: process.env.KIT_SUB ?? "alice" }),
      });
      if (r.status !== 200) throw new Error("token endpoint: " + r.status + " " + (await r.text()));
      const j = await r.json();
      const t = new ark.SluiceToken();
      t.accessToken = j.access_token;
      t.signingKey = j.signing_key;
      this.cached = t;
      this.mints += 1;
    }
    return this.cached;
  }
  invalidate() {
    this.cached = null;
  }
}

const tokens = new BackendTokens();
const client = new ark.SluiceHttpClient(baseURL, tokens, Number(process.env.KIT_MAX_RETRIES ?? "2"), new kit.WebSluiceCrypto(globalThis.crypto));
const body = JSON.stringify({ model: "chat-model", messages: [{ role: "user", content: prompt }] });
const r = await client.request("POST", "/v1/chat/completions", body);
console.log(JSON.stringify({
  status: r.status,
  attempts: r.attempts,
  body: r.body,
  mints: tokens.mints,
  seen: http.attempts.map((a) => ({ method: a.method, url: a.url, nonce: a.header["X-Sluice-Nonce"], status: a.status, body_bytes: a.bodyBytes })),
}));
