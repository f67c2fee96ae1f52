// clients_langchain.mjs — @langchain/openai's ChatOpenAI (invoke, stream)
// through sluice, for tests/integration/test_clients_matrix.py.
//
//   node clients_langchain.mjs BASE_URL MODE    (MODE: invoke | stream)
import { ChatOpenAI } from "@langchain/openai";

const [baseURL, mode] = process.argv.slice(2);
const llm = new ChatOpenAI({
  model: "chat-model",
  apiKey: "k",
  configuration: { baseURL },
  maxRetries: 0,
  streamUsage: true,
});

async function main() {
  if (mode === "invoke") {
    const m = await llm.invoke("matrix");
    return { text: m.content, usage: m.usage_metadata ?? null };
  }
  let text = "", chunks = 0, usage = null;
  for await (const c of await llm.stream("matrix")) {
    chunks++;
    text += c.content;
    if (c.usage_metadata) usage = c.usage_metadata;
  }
  return { text, chunks, usage };
}

main().then(
  (r) => console.log(JSON.stringify(r)),
  (e) => {
    console.log(JSON.stringify({ error: String(e), status: e.status ?? null }));
    process.exit(3);
  },
);
