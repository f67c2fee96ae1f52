// cache_client.mjs — one chat request through sluice with the official
// `openai` npm client, for tests/integration/test_cache.py: the cache replays
// an answer in the shape asked for (JSON or SSE, usage when asked), and the
// client must read it as it reads a model's own. Prints one JSON line: the
// text, finish reasons, usage, X-Sluice-Cache and Age as the client saw them.
//
//   node cache_client.mjs BASE_URL MODE PROMPT
//   MODE: json | stream | stream_usage | helper (chat.completions.stream())
import OpenAI from "openai";

const [baseURL, mode, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 20000 });
const params = { model: "chat-model", temperature: 0, messages: [{ role: "user", content: prompt }] };

function head(response) {
  return { cache: response.headers.get("x-sluice-cache"), age: response.headers.get("age") };
}

async function main() {
  if (mode === "json") {
    const { data, response } = await client.chat.completions.create(params).withResponse();
    return {
      text: data.choices[0].message.content,
      finish: data.choices.map((c) => c.finish_reason),
      usage: data.usage ?? null,
      ...head(response),
    };
  }
  if (mode === "helper") {
    const runner = client.chat.completions.stream(params);
    const done = await runner.finalChatCompletion();
    return { text: done.choices[0].message.content, finish: done.choices.map((c) => c.finish_reason) };
  }
  const extra = mode === "stream_usage" ? { stream_options: { include_usage: true } } : {};
  const { data: stream, response } = await client.chat.completions
    .create({ ...params, ...extra, stream: true })
    .withResponse();
  const out = { text: "", finish: [], usage: null, chunks: 0, ...head(response) };
  for await (const chunk of stream) {
    out.chunks += 1;
    for (const c of chunk.choices ?? []) {
      out.text += c.delta?.content ?? "";
      if (c.finish_reason) out.finish.push(c.finish_reason);
    }
    if (chunk.usage) out.usage = chunk.usage;
  }
  return out;
}

main().then(
  (r) => console.log(JSON.stringify(r)),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
