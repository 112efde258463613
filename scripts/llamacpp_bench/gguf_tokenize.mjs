// llama.cpp's own tokenization (and detokenization) of texts through a GGUF file's vocabulary, by the llama.cpp that
// node-llama-cpp ships prebuilt: the reference tests/gguf_spm_tokenizer_test.cpp compares mambacpp's GGUF tokenizer
// with (scripts/llamacpp_bench/spm_tokenize_check.sh writes the fixture).
//   node gguf_tokenize.mjs --model m.gguf --texts texts.json --out out.json
// texts.json: a JSON array of strings. out.json: {"texts": [...], "ids": [[...]], "decoded": [...]}: ids with special
// tokens in the text matched and nothing added (BOS is the caller's), decoded = detokenize(ids) with special tokens
// rendered.
import fs from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const a = { model: "", texts: "", out: "" };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
if (!a.model || !a.texts || !a.out) throw new Error("--model FILE.gguf --texts TEXTS.json --out OUT.json are required");
const texts = JSON.parse(fs.readFileSync(a.texts, "utf8"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 2 });
const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0, vocabOnly: true });
const ids = texts.map((t) => Array.from(model.tokenize(t, true)));
const decoded = ids.map((x) => model.detokenize(x, true));
fs.writeFileSync(a.out, JSON.stringify({ model: a.model, texts, ids, decoded }));
await model.dispose();
await llama.dispose();
