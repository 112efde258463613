// llama.cpp's prompt processing and decode speed on a GGUF, through the llama.cpp libraries that node-llama-cpp
// ships prebuilt (CPU only). The same workload as `mambacpp bench`: a random prompt of -p tokens, then -g greedy
// decode steps, median of -r timed runs after one warm-up; one JSON line out.
//   node bench_llama.mjs --model m.gguf --threads 2 --prompt 100 --gen 200 --repeat 3
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const a = { model: "", threads: 2, prompt: 100, gen: 200, repeat: 3 };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
for (const k of ["threads", "prompt", "gen", "repeat"]) a[k] = Number(a[k]);
if (!a.model) throw new Error("--model FILE.gguf is required");

const median = (v) => {
  const s = [...v].sort((x, y) => x - y), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: a.threads });
const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0 });
const context = await model.createContext({ contextSize: a.prompt + a.gen + 16, batchSize: 512, threads: a.threads,
                                             sequences: 1 });
const seq = context.getSequence();
const vocab = 50000;  // below both shapes' vocabularies; ids 259+ are the placeholder t<i> tokens
let x = 12345;
const prompt = Array.from({ length: a.prompt }, () => ((x = (x * 1103515245 + 12345) % 2147483648), 259 + (x % (vocab - 259))));

const prefill = [], decode = [];
for (let rep = 0; rep < a.repeat + 1; rep++) {
  await seq.clearHistory();
  const t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
  let n = 0;
  let t1 = 0;
  // The last prompt token's evaluation yields the first generated token: that closes prompt processing.
  for await (const _ of seq.evaluate([prompt[prompt.length - 1]], { temperature: 0 })) {
    if (n === 0) t1 = performance.now();
    if (++n > a.gen) break;
  }
  const t2 = performance.now();
  if (rep === 0) continue;
  prefill.push(t1 - t0);
  decode.push(t2 - t1);
}
const p = median(prefill), d = median(decode);
console.log(JSON.stringify({
  engine: "llama.cpp", model: a.model, threads: a.threads, prompt: a.prompt, gen: a.gen, repeat: a.repeat,
  prefill_ms: p, prefill_tokens_per_s: a.prompt / (p / 1000), decode_ms_per_step: d / a.gen,
  decode_tokens_per_s: a.gen / (d / 1000), prefill_ms_runs: prefill, decode_ms_runs: decode,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
