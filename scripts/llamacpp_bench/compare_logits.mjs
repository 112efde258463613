// Compares `mambacpp logits` (a float32 .npy [L, V]) with gguf_logits.mjs's llama.cpp log-probabilities on the same
// tokens: per position, the largest difference of log_softmax over the tokens llama.cpp reports, and whether the
// argmax agrees (where the top-2 margin is above --margin). One JSON line out; exit 1 past --tol.
//   node compare_logits.mjs --ours ours.npy --theirs ll.json --tol 1e-4
import fs from "node:fs";

const a = { ours: "", theirs: "", tol: "1e-4", margin: "1e-3" };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];

function readNpy(path) {
  const b = fs.readFileSync(path);
  if (b.toString("latin1", 1, 6) !== "NUMPY") throw new Error(`${path}: not a .npy file`);
  const hlen = b.readUInt16LE(8);
  const header = b.toString("latin1", 10, 10 + hlen);
  if (!header.includes("'<f4'")) throw new Error(`${path}: expected float32, header ${header}`);
  const shape = header.match(/\((\d+), (\d+)\)/).slice(1).map(Number);
  const data = new Float32Array(b.buffer.slice(b.byteOffset + 10 + hlen, b.byteOffset + b.length));
  return { shape, data };
}

const ours = readNpy(a.ours);
const theirs = JSON.parse(fs.readFileSync(a.theirs, "utf8"));
const [L, V] = ours.shape;
if (theirs.logprobs.length !== L) throw new Error(`positions: ours ${L}, llama.cpp ${theirs.logprobs.length}`);
let maxDiff = 0, argmaxAgree = 0, decided = 0;
for (let t = 0; t < L; t++) {
  const row = ours.data.subarray(t * V, (t + 1) * V);
  let m = -Infinity;
  for (const x of row) m = Math.max(m, x);
  let s = 0;
  for (const x of row) s += Math.exp(x - m);
  const lse = m + Math.log(s);
  const lp = theirs.logprobs[t];
  for (const [tok, v] of Object.entries(lp)) {
    const ourv = row[Number(tok)] - lse;
    if (v > -20) maxDiff = Math.max(maxDiff, Math.abs(ourv - v));  // p < 2e-9 is below llama.cpp's f32 softmax
  }
  const order = [...row.keys()].sort((i, j) => row[j] - row[i]);
  const theirTop = Number(Object.entries(lp).sort((x, y) => y[1] - x[1])[0][0]);
  if (row[order[0]] - row[order[1]] > Number(a.margin)) {
    decided++;
    if (order[0] === theirTop) argmaxAgree++;
  }
}
const ok = maxDiff <= Number(a.tol) && argmaxAgree === decided;
console.log(JSON.stringify({ positions: L, vocab: V, max_abs_logprob_diff: maxDiff, argmax_agree: argmaxAgree,
                             argmax_decided: decided, tol: Number(a.tol), ok }));
process.exit(ok ? 0 : 1);
