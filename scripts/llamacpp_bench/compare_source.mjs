// Compares two float32 .npy logit files [L, V] (ours on a GGUF file against the checkpoint fixture's logits.npy):
// max |difference| and max |difference| / max |reference|. One JSON line out; exit 1 past --tol (absolute).
//   node compare_source.mjs --ours ours.npy --ref fixtures/.../logits.npy --tol 1e-5
import fs from "node:fs";

const a = { ours: "", ref: "", tol: "1e-5" };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];

function readNpy(path) {
  const b = fs.readFileSync(path);
  if (b.toString("latin1", 1, 6) !== "NUMPY") throw new Error(`${path}: not a .npy file`);
  const hlen = b.readUInt16LE(8);
  const header = b.toString("latin1", 10, 10 + hlen);
  const shape = header.match(/\(([\d, ]*)\)/)[1].split(",").filter((s) => s.trim()).map(Number);
  const body = b.buffer.slice(b.byteOffset + 10 + hlen, b.byteOffset + b.length);
  if (header.includes("'<f4'")) return { shape, data: new Float32Array(body) };
  if (header.includes("'<f8'")) return { shape, data: new Float64Array(body) };
  throw new Error(`${path}: expected float32 or float64, header ${header}`);
}

const ours = readNpy(a.ours), ref = readNpy(a.ref);
if (ours.data.length !== ref.data.length)
  throw new Error(`sizes: ours [${ours.shape}], reference [${ref.shape}]`);
let maxDiff = 0, maxRef = 0;
for (let i = 0; i < ref.data.length; i++) {
  maxDiff = Math.max(maxDiff, Math.abs(ours.data[i] - ref.data[i]));
  maxRef = Math.max(maxRef, Math.abs(ref.data[i]));
}
const ok = maxDiff <= Number(a.tol);
console.log(JSON.stringify({ shape: ref.shape, max_abs_diff: maxDiff, max_rel_diff: maxDiff / maxRef,
                             tol: Number(a.tol), ok }));
process.exit(ok ? 0 : 1);
