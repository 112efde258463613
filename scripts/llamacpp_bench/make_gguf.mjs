// Writes a GGUF of random weights of a real Mamba / Mamba-2 shape for llama.cpp, the shapes of
// src/model/shapes.cpp and the value ranges of src/model/random_weights.cpp (projections uniform in
// ±1/sqrt(fan_in), norms and D one, A = -(1 + 15u), dt_bias = softplus^-1 of dt in [0.001, 0.1]).
// Speed does not depend on the values, only on the shapes and the stored types.
//   node make_gguf.mjs --shape mamba2-130m --type f16 --out m.gguf      (--type f32 | f16 | q8_0)
// Matrices are stored in --type (q8_0 falls back to f16 where a row is not a multiple of 32); vectors, the conv
// taps and A/D in f32, as llama.cpp's converter does. Tied embeddings: no output.weight (llama.cpp reuses
// token_embd). The vocabulary is a placeholder SentencePiece list (the benchmark feeds token ids, never text).
import fs from "node:fs";

const SHAPES = {
  "mamba-130m": { arch: "mamba", d_model: 768, n_layer: 24 },
  "mamba-370m": { arch: "mamba", d_model: 1024, n_layer: 48 },
  "mamba-1.4b": { arch: "mamba", d_model: 2048, n_layer: 48 },
  "mamba-2.8b": { arch: "mamba", d_model: 2560, n_layer: 64 },
  "mamba2-130m": { arch: "mamba2", d_model: 768, n_layer: 24 },
  "mamba2-370m": { arch: "mamba2", d_model: 1024, n_layer: 48 },
  "mamba2-1.3b": { arch: "mamba2", d_model: 2048, n_layer: 48 },
  "mamba2-2.7b": { arch: "mamba2", d_model: 2560, n_layer: 64 },
};

function args() {
  const a = { shape: "mamba2-130m", type: "f16", out: "" };
  for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
  if (!SHAPES[a.shape]) throw new Error(`--shape: unknown '${a.shape}'; known: ${Object.keys(SHAPES).join(", ")}`);
  if (!["f32", "f16", "q8_0"].includes(a.type)) throw new Error(`--type: expected f32, f16 or q8_0, found '${a.type}'`);
  if (!a.out) throw new Error("--out FILE.gguf is required");
  return a;
}

// ---- values: a xorshift generator (fast; speed does not depend on the values) --------------------------------
let rng = 0x9e3779b9 >>> 0;
function uniform() {
  rng ^= rng << 13; rng >>>= 0;
  rng ^= rng >>> 17;
  rng ^= rng << 5; rng >>>= 0;
  return rng / 4294967296;
}

// ---- f16 and Q8_0 encodings ---------------------------------------------------------------------------------
const f32buf = new Float32Array(1), u32buf = new Uint32Array(f32buf.buffer);
function f16bits(v) {  // round to nearest even; the values here are finite and well inside the f16 range
  f32buf[0] = v;
  const x = u32buf[0], sign = (x >>> 16) & 0x8000, abs = x & 0x7fffffff;
  if (abs < 0x38800000) {  // subnormal or zero
    const m = Math.round(Math.abs(f32buf[0]) * 16777216);
    return sign | m;
  }
  let half = (((abs >>> 23) - 112) << 10) | ((abs & 0x7fffff) >>> 13);
  const rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1))) half++;
  return sign | half;
}
const TYPES = { f32: 0, f16: 1, q8_0: 8 };
function encode(values, type) {
  const n = values.length;
  if (type === "f32") return Buffer.from(values.buffer, values.byteOffset, n * 4);
  if (type === "f16") {
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = f16bits(values[i]);
    return Buffer.from(out.buffer);
  }
  const blocks = n / 32, out = Buffer.alloc(blocks * 34);  // q8_0: f16 scale, 32 int8
  for (let b = 0; b < blocks; b++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(values[b * 32 + i]));
    const d = amax / 127, id = d ? 1 / d : 0;
    out.writeUInt16LE(f16bits(d), b * 34);
    for (let i = 0; i < 32; i++) out.writeInt8(Math.round(values[b * 32 + i] * id), b * 34 + 2 + i);
  }
  return out;
}

// ---- the model's tensors (ggml order: ne[0] is the row length) ---------------------------------------------
function tensors(s) {
  const d = s.d_model, di = 2 * d, K = 4, L = [];
  const mat = (name, ne) => L.push({ name, ne, kind: "matrix" });
  const vec = (name, ne, kind) => L.push({ name, ne, kind });
  const mamba2 = s.arch === "mamba2";
  const vocab = mamba2 ? 50288 : 50280, N = mamba2 ? 128 : 16, heads = di / 64, groups = 1;
  const dt_rank = Math.ceil(d / 16);
  mat("token_embd.weight", [d, vocab]);
  vec("output_norm.weight", [d], "one");
  for (let i = 0; i < s.n_layer; i++) {
    const p = `blk.${i}.`;
    vec(p + "attn_norm.weight", [d], "one");
    if (mamba2) {
      const conv = di + 2 * groups * N;
      mat(p + "ssm_in.weight", [d, 2 * di + 2 * groups * N + heads]);
      vec(p + "ssm_conv1d.weight", [K, conv], "conv");
      vec(p + "ssm_conv1d.bias", [conv], "conv");
      vec(p + "ssm_dt.bias", [heads], "dt_bias");
      vec(p + "ssm_a", [1, heads], "a");
      vec(p + "ssm_d", [1, heads], "one");
      vec(p + "ssm_norm.weight", [di / groups, groups], "one");
    } else {
      mat(p + "ssm_in.weight", [d, 2 * di]);
      vec(p + "ssm_conv1d.weight", [K, di], "conv");
      vec(p + "ssm_conv1d.bias", [di], "conv");
      mat(p + "ssm_x.weight", [di, dt_rank + 2 * N]);
      mat(p + "ssm_dt.weight", [dt_rank, di]);
      vec(p + "ssm_dt.bias", [di], "dt_bias");
      vec(p + "ssm_a", [N, di], "a");
      vec(p + "ssm_d", [di], "one");
    }
    mat(p + "ssm_out.weight", [di, d]);
  }
  const kv = [
    ["general.architecture", "string", s.arch],
    ["general.name", "string", `${s.name} (random weights)`],
    [`${s.arch}.context_length`, "u32", 1048576],
    [`${s.arch}.embedding_length`, "u32", d],
    [`${s.arch}.block_count`, "u32", s.n_layer],
    [`${s.arch}.feed_forward_length`, "u32", 0],
    [`${s.arch}.attention.head_count`, "u32", 0],
    [`${s.arch}.attention.layer_norm_rms_epsilon`, "f32", 1e-5],
    [`${s.arch}.ssm.conv_kernel`, "u32", K],
    [`${s.arch}.ssm.inner_size`, "u32", di],
    [`${s.arch}.ssm.state_size`, "u32", N],
    [`${s.arch}.ssm.time_step_rank`, "u32", mamba2 ? heads : dt_rank],
  ];
  if (mamba2) kv.push([`${s.arch}.ssm.group_count`, "u32", groups]);
  return { tensors: L, kv, vocab };
}

function values(t) {
  const n = t.ne.reduce((a, b) => a * b, 1), v = new Float32Array(n);
  const scale = 1 / Math.sqrt(t.ne[0]);
  for (let i = 0; i < n; i++) {
    const u = uniform();
    if (t.kind === "one") v[i] = 1;
    else if (t.kind === "a") v[i] = -(1 + 15 * u);  // -exp(A_log), A_log = log(1 + 15u)
    else if (t.kind === "dt_bias") v[i] = Math.log(Math.expm1(0.001 + 0.099 * u));
    else v[i] = (2 * u - 1) * scale;
  }
  return v;
}

// ---- GGUF v3 ----------------------------------------------------------------------------------------------------
class Writer {
  constructor() { this.parts = []; }
  u32(x) { const b = Buffer.alloc(4); b.writeUInt32LE(x); this.parts.push(b); }
  i32(x) { const b = Buffer.alloc(4); b.writeInt32LE(x); this.parts.push(b); }
  u64(x) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(x)); this.parts.push(b); }
  f32(x) { const b = Buffer.alloc(4); b.writeFloatLE(x); this.parts.push(b); }
  str(s) { const b = Buffer.from(s, "utf8"); this.u64(b.length); this.parts.push(b); }
  buffer() { return Buffer.concat(this.parts); }
}
const GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_STRING = 8, GGUF_ARRAY = 9, ALIGN = 32;

function main() {
  const a = args(), s = { ...SHAPES[a.shape], name: a.shape };
  const { tensors: list, kv, vocab } = tensors(s);
  const w = new Writer();
  w.u32(0x46554747); w.u32(3); w.u64(list.length); w.u64(kv.length + 4);
  for (const [key, type, value] of kv) {
    w.str(key);
    if (type === "string") { w.u32(GGUF_STRING); w.str(value); }
    else if (type === "u32") { w.u32(GGUF_U32); w.u32(value); }
    else { w.u32(GGUF_F32); w.f32(value); }
  }
  // Placeholder SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then t<i>.
  const tokens = [], types = [];
  for (let i = 0; i < vocab; i++) {
    if (i < 3) tokens.push(["<unk>", "<s>", "</s>"][i]), types.push(i === 0 ? 2 : 3);
    else if (i < 259) tokens.push(`<0x${(i - 3).toString(16).toUpperCase().padStart(2, "0")}>`), types.push(6);
    else tokens.push(`t${i}`), types.push(1);
  }
  w.str("tokenizer.ggml.model"); w.u32(GGUF_STRING); w.str("llama");
  w.str("tokenizer.ggml.tokens"); w.u32(GGUF_ARRAY); w.u32(GGUF_STRING); w.u64(vocab); for (const t of tokens) w.str(t);
  w.str("tokenizer.ggml.scores"); w.u32(GGUF_ARRAY); w.u32(GGUF_F32); w.u64(vocab); for (let i = 0; i < vocab; i++) w.f32(-i);
  w.str("tokenizer.ggml.token_type"); w.u32(GGUF_ARRAY); w.u32(GGUF_I32); w.u64(vocab); for (const t of types) w.i32(t);

  let offset = 0;
  for (const t of list) {
    t.type = t.kind === "matrix" ? a.type : "f32";
    if (t.type === "q8_0" && t.ne[0] % 32 !== 0) t.type = "f16";
    const n = t.ne.reduce((x, y) => x * y, 1);
    t.bytes = t.type === "f32" ? n * 4 : t.type === "f16" ? n * 2 : (n / 32) * 34;
    w.str(t.name); w.u32(t.ne.length); for (const e of t.ne) w.u64(e); w.u32(TYPES[t.type]); w.u64(offset);
    offset += Math.ceil(t.bytes / ALIGN) * ALIGN;
  }
  let header = w.buffer();
  header = Buffer.concat([header, Buffer.alloc((ALIGN - (header.length % ALIGN)) % ALIGN)]);
  const fd = fs.openSync(a.out, "w");
  fs.writeSync(fd, header);
  for (const t of list) {
    const data = encode(values(t), t.type);
    fs.writeSync(fd, data);
    const pad = Math.ceil(t.bytes / ALIGN) * ALIGN - t.bytes;
    if (pad) fs.writeSync(fd, Buffer.alloc(pad));
  }
  fs.closeSync(fd);
  console.error(`wrote ${a.out}: ${a.shape}, ${a.type}, ${list.length} tensors, ${(offset / 1e6).toFixed(1)} MB of weights`);
}

main();
