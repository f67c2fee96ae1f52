// clients_retry.mjs — the official `openai` npm client's own retries against
// sluice's 429/503, for tests/integration/test_clients_retry.py. A fetch
// wrapper records every attempt the SDK makes (time, status, the retry
// headers it read), so the test can match them with what the mock saw.
//
//   node clients_retry.mjs BASE_URL MAX_RETRIES [MODEL]
import OpenAI from "openai";

const [baseURL, maxRetries = "2", model = "chat-model"] = process.argv.slice(2);
const t0 = Date.now();
const attempts = [];
const client = new OpenAI({
  baseURL,
  apiKey: "client-key-never-forwarded",
  maxRetries: Number(maxRetries),
  timeout: 30000,
  fetch: async (url, init) => {
    const at = Date.now() - t0;
    const res = await fetch(url, init);
    const h = (n) => res.headers.get(n);
    attempts.push({
      at,
      status: res.status,
      should_retry: h("x-should-retry"),
      retry_after: h("retry-after"),
      retry_after_ms: h("retry-after-ms"),
    });
    return res;
  },
});

const out = { attempts, error: null, text: null };
try {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "retry me" }],
  });
  out.text = r.choices[0].message.content;
} catch (e) {
  out.error = { name: e.constructor.name, status: e.status ?? null };
}
out.elapsed = Date.now() - t0;
console.log(JSON.stringify(out));
