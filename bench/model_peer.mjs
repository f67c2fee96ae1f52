// model_peer.mjs — llama.cpp (the prebuilt library inside the npm package
// node-llama-cpp, never installed by CI) on the same GGUF file as
// `mdl_tool bench`: prefill tok/s of a PROMPT-token prompt and greedy decode
// tok/s over GEN tokens, on THREADS threads. Prints one line in
// mdl_tool bench's key=value form so bench/model_peer.sh can take ratios.
//
// usage: node model_peer.mjs FILE PROMPT GEN THREADS   (run from a directory
// where node-llama-cpp is installed: bench/model_peer.sh does that)
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [file, P = "256", G = "32", T = "1"] = process.argv.slice(2);
const prompt = Number(P), gen = Number(G), threads = Number(T);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ filename: file, modelPath: file, gpuLayers: 0 });
const context = await model.createContext({
    contextSize: prompt + gen + 16, batchSize: Math.max(prompt, 32), threads, sequences: 1,
});
const seq = context.getSequence();
let x = 12345n;
const toks = [];
for (let i = 0; i < prompt; i++) { // the same generator as mdl_tool bench, ids below 50,000
    x = (x * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
    toks.push(Number((x >> 33n) % 50000n));
}
// warm-up: one token, then a fresh sequence state
await seq.evaluateWithoutGeneratingNewTokens([toks[0]]);
await seq.clearHistory();
const t0 = process.hrtime.bigint();
await seq.evaluateWithoutGeneratingNewTokens(toks);
const t1 = process.hrtime.bigint();
let n = 0, t2 = t1;
const it = seq.evaluate([toks[prompt - 1]], { temperature: 0 });
for await (const tok of it) {
    void tok;
    if (++n >= gen) { t2 = process.hrtime.bigint(); break; }
}
const pre = Number(t1 - t0) / 1e9, dec = Number(t2 - t1) / 1e9;
console.log(`peer=llama.cpp threads=${threads} prefill_tokens=${prompt} prefill_tps=${(prompt / pre).toFixed(2)} ` +
    `decode_tokens=${gen} decode_tps=${(gen / dec).toFixed(2)}`);
await context.dispose();
await model.dispose();
