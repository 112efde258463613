// llama.cpp's perplexity and KL divergence over a text, for GGUF files of one model in several weight formats, through
// the llama.cpp that node-llama-cpp ships prebuilt (CPU): the numbers `mambacpp perplexity --kl-base` gives for ours
// (docs/benchmarks.md, "CPU block-format weights"). The text is tokenized once by llama.cpp with the base file; the
// state is carried through the whole text (as `mambacpp perplexity` with --context 0); every position but the last
// is scored. One JSON line per file: perplexity, mean and max KL from the base (nats/token), top-token agreement.
//   node llama_quality.mjs --text-file F --base base.gguf q8_0.gguf q4_k.gguf ...
import fs from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
let textFile = "", base = "";
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--text-file") textFile = args[++i];
  else if (args[i] === "--base") base = args[++i];
  else files.push(args[i]);
}
if (!textFile || !base) throw new Error("usage: --text-file F --base base.gguf [other.gguf ...]");
const text = fs.readFileSync(textFile, "utf8");
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 2 });
const opts = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const kChunk = 512;

// Every scored position's log-probabilities (n_vocab floats each), in position order.
async function logprobs(path, tokens) {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  const ctx = await model.createContext({ contextSize: tokens.length + 16, threads: 2, sequences: 1 });
  const seq = ctx.getSequence();
  let V = 0, out = null;  // the vocabulary's size: the first distribution's (it holds every token)
  for (let start = 0; start < tokens.length - 1; start += kChunk) {
    const piece = tokens.slice(start, Math.min(start + kChunk, tokens.length - 1));
    const res = await seq.controlledEvaluate(piece.map((t) => [t, { generateNext: { probabilities: true, options: opts } }]));
    if (!out) {
      V = res[0].next.probabilities.size;
      out = new Float32Array((tokens.length - 1) * V).fill(-Infinity);
    }
    res.forEach((o, j) => {
      const row = out.subarray((start + j) * V, (start + j + 1) * V);
      for (const [tok, p] of o.next.probabilities) row[tok] = Math.log(p);
    });
  }
  await ctx.dispose();
  await model.dispose();
  return { V, lp: out };
}

const baseModel = await llama.loadModel({ modelPath: base, gpuLayers: 0 });
const tokens = Array.from(baseModel.tokenize(text));
await baseModel.dispose();
const b = await logprobs(base, tokens);
for (const path of [base, ...files]) {
  const q = path === base ? b : await logprobs(path, tokens);
  if (q.V !== b.V) throw new Error(`${path}: vocabulary ${q.V}, the base has ${b.V}`);
  const V = b.V, n = tokens.length - 1;
  let nll = 0, kl = 0, klMax = 0, same = 0;
  for (let i = 0; i < n; ++i) {
    const lb = b.lp.subarray(i * V, (i + 1) * V), lq = q.lp.subarray(i * V, (i + 1) * V);
    nll -= lq[tokens[i + 1]];
    let k = 0, ab = 0, aq = 0;
    for (let t = 0; t < V; ++t) {
      if (lb[t] > -Infinity) k += Math.exp(lb[t]) * (lb[t] - lq[t]);
      if (lb[t] > lb[ab]) ab = t;
      if (lq[t] > lq[aq]) aq = t;
    }
    kl += k;
    klMax = Math.max(klMax, k);
    if (ab === aq) ++same;
  }
  console.log(JSON.stringify({ file: path, tokens: tokens.length, scored: n, perplexity: Math.exp(nll / n),
                               mean_kl: kl / n, max_kl: klMax, same_top: same / n }));
}
