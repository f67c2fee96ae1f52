// clients_matrix.mjs — the client matrix of tests/integration/test_clients_matrix.py:
// the official `openai` npm client and the Vercel AI SDK (`ai` +
// `@ai-sdk/openai`, whose default model speaks the Responses API), each
// driven through sluice against the mock upstream. Prints one JSON line.
//
//   node clients_matrix.mjs BASE_URL MODE
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const [baseURL, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "k", maxRetries: 0, timeout: 20000 });
const provider = createOpenAI({ baseURL, apiKey: "k" });
const model = "chat-model";
const messages = [{ role: "user", content: "matrix" }];

async function main() {
  switch (mode) {
    case "chat": {
      const r = await client.chat.completions.create({ model, messages });
      return { text: r.choices[0].message.content, usage: r.usage };
    }
    case "stream_usage": {
      const s = await client.chat.completions.create({
        model, messages, stream: true, stream_options: { include_usage: true },
      });
      let text = "", usage = null, chunks = 0;
      for await (const c of s) {
        chunks++;
        text += c.choices?.[0]?.delta?.content ?? "";
        if (c.usage) usage = c.usage;
      }
      return { text, usage, chunks };
    }
    case "tools": {
      const r = await client.chat.completions.create({
        model, messages,
        tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
      });
      return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
    }
    case "responses": {
      const r = await client.responses.create({ model, input: "matrix" });
      const got = await client.responses.retrieve(r.id);
      const del = await client.responses.delete(r.id).then(() => true, (e) => String(e));
      return { id: r.id, text: r.output_text, got: got.id, deleted: del };
    }
    case "responses_stream": {
      const s = await client.responses.create({ model, input: "matrix", stream: true });
      const types = [];
      let text = "";
      for await (const e of s) {
        types.push(e.type);
        if (e.type === "response.output_text.delta") text += e.delta;
      }
      return { text, types };
    }
    case "ai_generate": {
      const r = await generateText({ model: provider(model), prompt: "matrix" });
      return { text: r.text, finish: r.finishReason };
    }
    case "ai_chat": {
      const r = await generateText({ model: provider.chat(model), prompt: "matrix" });
      return { text: r.text, finish: r.finishReason };
    }
    case "ai_stream": {
      const r = streamText({ model: provider(model), prompt: "matrix" });
      let text = "", parts = 0;
      for await (const t of r.textStream) {
        text += t;
        parts++;
      }
      return { text, parts, finish: await r.finishReason };
    }
    default:
      throw new Error("unknown mode " + mode);
  }
}

main().then(
  (r) => console.log(JSON.stringify(r)),
  (e) => {
    console.log(JSON.stringify({ error: String(e), status: e.status ?? null }));
    process.exit(3);
  },
);
