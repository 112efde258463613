// The table of run.sh's results: per shape, the median over rounds of each engine's decode and prompt tokens/s,
// the ratios the targets are stated in, and each run's share of its bandwidth floor (bytes a decode step must move:
// weights read once plus the f32/bf16 state read and written, over the read bandwidth measured in the same block);
// for prompt processing, the achieved GFLOP/s of each run (the model's FLOPs per token below) beside the f32 FMA peak
// measured in the same block.
//   node summarise.mjs results.jsonl
import fs from "node:fs";

const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.trim().startsWith("{"));
const runs = lines.map((l) => JSON.parse(l));
const median = (v) => {
  const s = [...v].sort((a, b) => a - b), m = s.length >> 1;
  return s.length ? (s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2) : NaN;
};
// f32 state bytes of one decode step's state (read once + written once is 2x this), as src/model/shapes.cpp.
function stateBytes(shape) {
  const d = { "130m": [768, 24], "370m": [1024, 48], "1.3b": [2048, 48], "1.4b": [2048, 48], "2.7b": [2560, 64],
              "2.8b": [2560, 64] }[shape.split("-")[1]];
  const [dm, layers] = d, di = 2 * dm, K = 4;
  const mamba2 = shape.startsWith("mamba2"), N = mamba2 ? 128 : 16, conv = mamba2 ? di + 2 * N : di;
  return layers * (conv * (K - 1) + di * N) * 4;
}
// FLOPs a prompt token costs at least, the same count for both engines: every projection matrix once (2 flops per
// weight) and the selective scan in its recurrent form (state update and output: 4 flops per state element); the
// LM head runs for the last token only and the conv and elementwise work are left out.
function flopsPerToken(shape) {
  const d = { "130m": [768, 24], "370m": [1024, 48], "1.3b": [2048, 48], "1.4b": [2048, 48], "2.7b": [2560, 64],
              "2.8b": [2560, 64] }[shape.split("-")[1]];
  const [dm, layers] = d, di = 2 * dm;
  if (shape.startsWith("mamba2")) {
    const N = 128, heads = di / 64, inProj = 2 * di + 2 * N + heads;
    return layers * (2 * (dm * inProj + di * dm) + 4 * N * di);
  }
  const N = 16, R = Math.ceil(dm / 16);
  return layers * (2 * (dm * 2 * di + di * (R + 2 * N) + R * di + di * dm) + 4 * N * di);
}
const fmt = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "—");
const shapes = [...new Set(runs.map((r) => r.shape))];
const out = [];
out.push("| decode, tokens/s | llama.cpp F32 / F16 / Q8_0 | mambacpp fp32 / bf16 / fp16 | fp32 ÷ F32 | bf16 ÷ F16 | " +
         "fp16 ÷ F16 | % of floor: llama.cpp F32 / F16 / Q8_0 | % of floor: mambacpp fp32 / bf16 / fp16 | " +
         "read GB/s, 2 MiB / 4 KiB pages |");
out.push("|---|---|---|---|---|---|---|---|---|");
const pre = [];
for (const s of shapes) {
  const of = (engine, dtype) => runs.filter((r) => r.shape === s && r.engine === engine && r.dtype === dtype);
  const bw = median(runs.filter((r) => r.shape === s && r.engine === "read_bw").map((r) => r.result.read_gb_s));  // 2 MiB
  const bw4k = median(runs.filter((r) => r.shape === s && r.engine === "read_bw").map((r) => r.result.read_gb_s_4k));
  const tps = (e, t) => median(of(e, t).map((r) => r.result.decode_tokens_per_s));
  const pps = (e, t) => median(of(e, t).map((r) => r.result.prefill_tokens_per_s));
  // Share of the floor per run, against the read bandwidth of that run's block (the higher of its 2 MiB and 4 KiB probes).
  const floor = (e, t) => median(of(e, t).map((r) => {
    const probe = runs.find((b) => b.engine === "read_bw" && b.shape === s && b.round === r.round).result;
    const bwr = Math.max(probe.read_gb_s, probe.read_gb_s_4k ?? 0) * 1e9;  // the higher of the two page sizes
    const bytes = e === "mambacpp" ? r.result.decode_step_bytes : r.gguf_bytes + 2 * stateBytes(s);
    return (100 * bytes / bwr) / (r.result.decode_ms_per_step / 1000);
  }));
  const L = ["f32", "f16", "q8_0"].map((t) => tps("llama.cpp", t)), M = ["f32", "bf16", "f16"].map((w) => tps("mambacpp", w));
  out.push(`| ${s} | ${L.map((x) => fmt(x)).join(" / ")} | ${M.map((x) => fmt(x)).join(" / ")} | ${fmt(M[0] / L[0], 2)}× | ` +
           `${fmt(M[1] / L[1], 2)}× | ${fmt(M[2] / L[1], 2)}× | ` +
           `${["f32", "f16", "q8_0"].map((t) => fmt(floor("llama.cpp", t), 0)).join(" / ")} | ` +
           `${["f32", "bf16", "f16"].map((w) => fmt(floor("mambacpp", w), 0)).join(" / ")} | ${fmt(bw, 1)} / ${fmt(bw4k, 1)} |`);
  const LP = ["f32", "f16", "q8_0"].map((t) => pps("llama.cpp", t)), MP = ["f32", "bf16", "f16"].map((w) => pps("mambacpp", w));
  const peak = median(runs.filter((r) => r.shape === s && r.engine === "fma_peak").map((r) => r.result.fma_peak_gflop_s));
  const gf = (x) => (x * flopsPerToken(s)) / 1e9;
  pre.push(`| ${s}, ${runs.find((r) => r.shape === s && r.engine === "mambacpp").result.prompt} tokens | ` +
           `${LP.map((x) => fmt(x, 0)).join(" / ")} | ${MP.map((x) => fmt(x, 0)).join(" / ")} | ` +
           `${fmt(MP[0] / LP[0], 2)}× | ${fmt(MP[1] / LP[1], 2)}× | ${fmt(MP[2] / LP[1], 2)}× | ` +
           `${LP.map((x) => fmt(gf(x), 0)).join(" / ")} | ${MP.map((x) => fmt(gf(x), 0)).join(" / ")} | ` +
           `${fmt(peak, 0)} | ${fmt(100 * gf(Math.max(...MP.filter(Number.isFinite))) / peak, 0)}% |`);
}
out.push("", "| prompt processing, tokens/s | llama.cpp F32 / F16 / Q8_0 | mambacpp fp32 / bf16 / fp16 | fp32 ÷ F32 | " +
         "bf16 ÷ F16 | fp16 ÷ F16 | GFLOP/s llama.cpp | GFLOP/s mambacpp | FMA peak GFLOP/s | mambacpp best, % of peak |",
         "|---|---|---|---|---|---|---|---|---|---|", ...pre);
const rounds = new Set(runs.map((r) => r.round)).size, loads = runs.map((r) => Number(r.loadavg.split(" ")[0]));
out.push("", `Medians of ${rounds} interleaved rounds; 1-minute load average at the runs: ${fmt(Math.min(...loads), 2)}–` +
         `${fmt(Math.max(...loads), 2)}; threads ${runs[0].threads}.`);
console.log(out.join("\n"));
