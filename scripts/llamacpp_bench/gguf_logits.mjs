// llama.cpp's next-token log-probabilities at every position of a token sequence, and its greedy continuation, on a
// GGUF file, through the llama.cpp that node-llama-cpp ships prebuilt (CPU). For comparing with `mambacpp logits` on
// the same file (docs/gguf.md). Sampling options that leave the distribution untouched (temperature 1, no top-k /
// top-p / min-p), so log(p) = log_softmax(logits).
//   node gguf_logits.mjs --model m.gguf --tokens "1 2 3" --gen 8 --out ll.json [--text "some text" | --text-file F]
//                        [--kv f32]   (an f32 KV cache and no flash attention: llama.cpp's defaults, an f16 cache
//                                      and its CPU flash attention, round attention's K, V and Q to f16)
// (with a text, its tokenization by llama.cpp is written too, as "tokenized")
import fs from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const a = { model: "", tokens: "", gen: 8, out: "", text: "", "text-file": "", kv: "" };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
if (!a.model || !a.out) throw new Error("--model FILE.gguf and --out FILE.json are required");
const ids = a.tokens.split(/[\s,]+/).filter(Boolean).map(Number);

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 2 });
const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0 });
// ggml's type ids: the context's constructor hands the value to the addon, which takes only numbers.
const kvType = { f32: 0, f16: 1, q8_0: 8 }[a.kv];
if (a.kv && kvType === undefined) throw new Error(`--kv ${a.kv}: expected f32, f16 or q8_0`);
const kv = a.kv ? { experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType, flashAttention: false } : {};
const ctx = await model.createContext({ contextSize: ids.length + Number(a.gen) + 16, threads: 2, sequences: 1, ...kv });
const seq = ctx.getSequence();
const opts = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const out = await seq.controlledEvaluate(ids.map((t) => [t, { generateNext: { probabilities: true, options: opts } }]));
const logprobs = out.map((o) => {
  const row = {};
  for (const [tok, p] of o.next.probabilities) row[tok] = Math.log(p);
  return row;
});
await seq.clearHistory();
const greedy = [];
for await (const t of seq.evaluate(ids, { temperature: 0 })) {
  greedy.push(t);
  if (greedy.length >= Number(a.gen)) break;
}
const result = { model: a.model, tokens: ids, logprobs, greedy };
if (a["text-file"]) a.text = fs.readFileSync(a["text-file"], "utf8");
if (a.text) result.tokenized = model.tokenize(a.text, true);  // special tokens in the text matched, as tokenizers does
fs.writeFileSync(a.out, JSON.stringify(result));
await ctx.dispose();
await model.dispose();
await llama.dispose();
