// kit_bench.mjs — what signing every attempt costs the client (figures, not a
// test): the TypeScript kit's sluiceSign per call for a few body sizes, and a
// POST round trip to a local node:http server through signingFetch against
// the same round trip through plain fetch, interleaved in rounds so that
// machine noise hits both alike. Costs are this process's CPU time (user +
// system: client and server both live here), which other load on a shared
// machine disturbs far less than wall time. Prints one JSON line.
//
//   node kit_bench.mjs KIT_DIST [ROUNDS]
//   (KIT_DIST: clients/typescript compiled, e.g. tsc -p clients/typescript --outDir /tmp/kit)
import http from "node:http";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [kitDist, roundsArg] = process.argv.slice(2);
const kit = await import(pathToFileURL(path.join(kitDist, "index.js")).href);
const rounds = Number(roundsArg ?? "10");
const crypto = await kit.sluiceDefaultCrypto();
const key = "3b1f0c9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";

function cpuUs() {
  const u = process.cpuUsage();
  return u.user + u.system;
}

async function signCostUs(size, n) {
  const body = new Uint8Array(size).fill(97);
  for (let i = 0; i < 2000; i++) await kit.sluiceSign(crypto, key, "POST", "/v1/chat/completions", body, Date.now());
  const c0 = cpuUs();
  for (let i = 0; i < n; i++) await kit.sluiceSign(crypto, key, "POST", "/v1/chat/completions", body, Date.now());
  return (cpuUs() - c0) / n;
}

const sign = {};
for (const size of [100, 1024, 16384]) sign[size] = +(await signCostUs(size, 2000)).toFixed(1);

const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end('{"ok":true}');
  });
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}/v1/chat/completions`;
const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(1000) }] });
const tokens = { get: async () => ({ accessToken: "t", signingKey: key }) };
const signed = kit.signingFetch({ tokens });
const init = { method: "POST", headers: { "Content-Type": "application/json" }, body };

async function batch(f, n) {
  const c0 = cpuUs();
  for (let i = 0; i < n; i++) await (await f(url, init)).text();
  return (cpuUs() - c0) / n;
}

await batch(fetch, 200);
await batch(signed, 200);
const plain = [], withKit = [];
for (let r = 0; r < rounds; r++) {
  // which goes first alternates: a slow moment hits both sides alike
  if (r % 2 === 0) {
    plain.push(await batch(fetch, 200));
    withKit.push(await batch(signed, 200));
  } else {
    withKit.push(await batch(signed, 200));
    plain.push(await batch(fetch, 200));
  }
}
server.close();
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const p = median(plain), k = median(withKit);
console.log(JSON.stringify({
  sign_cpu_us_by_body_bytes: sign,
  roundtrip_cpu_us_plain_fetch: +p.toFixed(1),
  roundtrip_cpu_us_signing_fetch: +k.toFixed(1),
  ratio_signing_to_plain: +(k / p).toFixed(3),
  rounds,
}));
