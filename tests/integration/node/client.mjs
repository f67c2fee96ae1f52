// client.mjs — drives sluice with the official `openai` npm client, for
// tests/integration/test_core_clients.py. Prints one JSON line with what the
// client saw, so the Python test can check it.
//
//   node client.mjs BASE_URL MODE [PROMPT]
//   MODE: chat | stream | models | completion | embeddings | error
//
// A stream records the time of each chunk (ms since start), with
// CHUNK_LINES=1 also prints "chunk N" as chunk N arrives, and, if the
// client library raises mid-stream (an SSE error event), the error. The
// client's `timeout` stops at the response head, so a stream that stalls
// after it is cut by our own abort after STREAM_MS: the output then says
// stalled, with the chunks seen, instead of the test's subprocess timing out
// with nothing to read.
import OpenAI from "openai";

const [baseURL, mode, prompt = "hello from node"] = process.argv.slice(2);
const client = new OpenAI({
  baseURL,
  apiKey: "client-key-never-forwarded",
  maxRetries: 0,
  timeout: 20000,
});
const t0 = Date.now();
const STREAM_MS = Number(process.env.STREAM_MS ?? 25000);
const messages = [{ role: "user", content: prompt }];

async function main() {
  switch (mode) {
    case "chat": {
      const r = await client.chat.completions.create({ model: "chat-model", messages });
      return { text: r.choices[0].message.content, model: r.model, usage: r.usage ?? null };
    }
    case "stream": {
      const out = { text: "", chunks: 0, times: [], error: null, stalled: false };
      const ac = new AbortController();
      const watchdog = setTimeout(() => {
        out.stalled = true;
        ac.abort();
      }, STREAM_MS);
      try {
        const stream = await client.chat.completions.create(
          {
            model: "chat-model",
            messages,
            stream: true,
            stream_options: { include_usage: true },
          },
          { signal: ac.signal },
        );
        for await (const chunk of stream) {
          out.chunks += 1;
          out.times.push(Date.now() - t0);
          // CHUNK_LINES=1: a line as each chunk arrives, for a test that
          // lets the mock send the next event only then (the final JSON
          // line still comes last)
          if (process.env.CHUNK_LINES) process.stdout.write("chunk " + out.chunks + "\n");
          out.text += chunk.choices?.[0]?.delta?.content ?? "";
          if (chunk.usage) out.usage = chunk.usage;
        }
      } catch (e) {
        out.error = { name: e.constructor.name, message: String(e.message), status: e.status ?? null };
      }
      clearTimeout(watchdog);
      out.ms = Date.now() - t0;
      return out;
    }
    case "models": {
      const ids = [];
      for await (const m of client.models.list()) ids.push(m.id);
      return { ids };
    }
    case "completion": {
      const r = await client.completions.create({ model: "chat-model", prompt });
      return { text: r.choices[0].text };
    }
    case "embeddings": {
      const r = await client.embeddings.create({ model: "embed-model", input: ["a", "b"] });
      return { n: r.data.length, dim: r.data[0].embedding.length };
    }
    case "error": {
      try {
        await client.chat.completions.create({ model: "no-such-model", messages });
        return { error: null };
      } catch (e) {
        return { error: { name: e.constructor.name, status: e.status ?? null, code: e.code ?? null, type: e.type ?? null } };
      }
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
