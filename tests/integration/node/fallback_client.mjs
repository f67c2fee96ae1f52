// fallback_client.mjs — the official `openai` npm client reading sluice's
// template replies (tests/integration/test_fallback_template.py). Prints one
// JSON line with what the client parsed and the X-Sluice-Fallback header it
// saw, so the Python test can check both.
//
//   node fallback_client.mjs BASE_URL MODE [LANG]
//   MODE: chat | stream | stream-usage | completion | completion-stream
//   LANG: sent as Accept-Language (default none)
import OpenAI from "openai";

const [baseURL, mode, lang] = process.argv.slice(2);
const client = new OpenAI({
  baseURL,
  apiKey: "client-key-never-forwarded",
  maxRetries: 0,
  timeout: 20000,
  defaultHeaders: lang ? { "Accept-Language": lang } : {},
});
const messages = [{ role: "user", content: "hello from node" }];

async function readStream(stream, pick) {
  const out = { text: "", chunks: 0, finish: [], usage: null, objects: [] };
  for await (const chunk of stream) {
    out.chunks += 1;
    out.objects.push(chunk.object);
    const c = chunk.choices?.[0];
    out.text += (c && pick(c)) ?? "";
    if (c?.finish_reason) out.finish.push(c.finish_reason);
    if (chunk.usage) out.usage = chunk.usage;
  }
  return out;
}

async function main() {
  switch (mode) {
    case "chat": {
      const { data, response } = await client.chat.completions
        .create({ model: "chat-model", messages })
        .withResponse();
      return {
        fallback: response.headers.get("x-sluice-fallback"),
        object: data.object,
        text: data.choices[0].message.content,
        role: data.choices[0].message.role,
        finish: data.choices[0].finish_reason,
        usage: data.usage ?? null,
      };
    }
    case "stream":
    case "stream-usage": {
      const params = { model: "chat-model", messages, stream: true };
      if (mode === "stream-usage") params.stream_options = { include_usage: true };
      const { data, response } = await client.chat.completions.create(params).withResponse();
      const out = await readStream(data, (c) => c.delta?.content);
      out.fallback = response.headers.get("x-sluice-fallback");
      return out;
    }
    case "completion": {
      const { data, response } = await client.completions
        .create({ model: "chat-model", prompt: "hello from node" })
        .withResponse();
      return {
        fallback: response.headers.get("x-sluice-fallback"),
        object: data.object,
        text: data.choices[0].text,
        finish: data.choices[0].finish_reason,
      };
    }
    case "completion-stream": {
      const { data, response } = await client.completions
        .create({ model: "chat-model", prompt: "hello from node", stream: true })
        .withResponse();
      const out = await readStream(data, (c) => c.text);
      out.fallback = response.headers.get("x-sluice-fallback");
      return out;
    }
    default:
      throw new Error("unknown mode " + mode);
  }
}

main().then(
  (r) => {
    console.log(JSON.stringify(r));
  },
  (e) => {
    console.error(e);
    process.exit(2);
  },
);
