#!/usr/bin/env python3
"""The anchor of issue 54's decode rows: mamba_ssm's generation on the same GPU as mambacpp, in the same job.

What runs is what the original throughput report ran (mamba's benchmarks/benchmark_generation_mamba_simple.py):
`MambaLMHeadModel.generate(input_ids, max_length, cg=True, return_dict_in_generate=True, output_scores=True, top_k=1)`
(greedy; prompt tokens drawn from [1, 1000)), with random weights of the same shapes as `mambacpp bench --shape`
(mamba_ssm's own initialization), in bf16 as mambacpp's rows (the report used fp16), so mamba_ssm's conv and SSM state
are bf16 (its state dtype is the model's). One generate call is
  - the prompt, eagerly (with only the last token's logits). Mamba-2 mixers: in_proj, causal_conv1d_fn (the CUDA
    forward kernel, channel-last), the Triton SSD chunk scan returning the final state, the Triton gated RMSNorm,
    out_proj. Mamba-1 mixers: in_proj, causal_conv1d_fn (CUDA forward), x_proj and dt_proj, then the package's
    `selective_scan_ref` (a PyTorch loop over the prompt's tokens) in place of selective_scan_cuda's kernel, which is
    not built here (the package's import of it fails softly; mamba_simple's selective_scan_fn is pointed at the
    reference), then out_proj. Blocks: the Triton fused add + RMSNorm; then lm_head;
  - then one token per step through a CUDA graph of the whole decode step, captured by the row's first call and
    replayed for every token of every later call: in_proj, causal_conv1d_update (CUDA), selective_state_update
    (Triton), Mamba-2's gated RMSNorm (Triton), out_proj, the fused add + RMSNorm, lm_head; around each replay, in
    Python: the token copied into the graph's input, the logits cloned (and cloned again for output_scores), argmax.
generate(max_length = P + N) returns N new tokens: the prompt's forward and N - 1 graph steps (`mambacpp bench -p P
-g N` runs the prompt and N steps: one step more).

Rows (name, model, batch, prompt P, N1, N2): each row's first call (N2 tokens) captures the graph, then one untimed
pair, then --runs pairs alternating N1 and N2, each call timed from torch.cuda.synchronize() to synchronize() with
perf_counter. ms/token = (median(N2 calls) - median(N1 calls)) / (N2 - N1): the prompt's cost cancels. total_s =
median(N2 calls), the report's end-to-end figure (the 130m row: prompt 100 + 1000 tokens). Checked per row: the graph
was captured once and replayed by every later call (never recaptured), sequences of P + N tokens, N finite score
rows, and the N1 call's tokens a prefix of the N2 call's (`same_tokens`; printed, not fatal).

Prints a line per row and appends a JSON object per row to --json (`error` instead of the figures where a row
failed; the other rows go on; `conv_check`: causal-conv1d's kernels against the package's references). --build-only: build and check causal-conv1d's kernels, print the seconds, exit.
mamba_ssm's sources travel with the tree (ignored folder SRC): the header of dev/mamba_ssm_anchor_common.py says how
SRC is made and what is built.
Usage: mamba_ssm_decode_anchor.py SRC [--rows NAME,...] [--runs N] [--json FILE] [--build DIR] [--build-only]
"""
import argparse
import gc
import json
import statistics
import sys
import time
import traceback

import mamba_ssm_anchor_common as common

ROWS = [  # name (scripts/gpu_decode_bench.sh's), shape, batch, prompt, N1, N2
    ("m2_130m", "mamba2-130m", 1, 100, 500, 1000),
    ("m2_2p7_b1", "mamba2-2.7b", 1, 16, 100, 200),
    ("m2_2p7_b32", "mamba2-2.7b", 32, 16, 32, 96),
    ("m2_2p7_b128", "mamba2-2.7b", 128, 16, 32, 96),
    ("m1_2p8_b1", "mamba-2.8b", 1, 16, 100, 200),
]


def use_the_decode_kernels():
    """The decode step's fast kernels must be the ones imported, not the PyTorch fallbacks; Mamba-1's prompt scan
    goes to selective_scan_ref where selective_scan_cuda is not built. Returns the prompt scan's name."""
    from mamba_ssm.modules import mamba2, mamba_simple
    from mamba_ssm.ops import selective_scan_interface
    for module in (mamba2, mamba_simple):
        for fn in ("causal_conv1d_fn", "causal_conv1d_update", "selective_state_update"):
            if getattr(module, fn) is None:
                raise RuntimeError(f"{module.__name__}.{fn} did not import: the step would take the PyTorch fallback")
    if selective_scan_interface.selective_scan_cuda is not None:
        return "selective_scan_cuda"
    mamba_simple.selective_scan_fn = selective_scan_interface.selective_scan_ref
    return "selective_scan_ref"


def check_output(torch, out, batch, prompt, n, name):
    if tuple(out.sequences.shape) != (batch, prompt + n):
        raise RuntimeError(f"{name}: sequences of shape {tuple(out.sequences.shape)}, expected {(batch, prompt + n)}")
    if len(out.scores) != n:
        raise RuntimeError(f"{name}: {len(out.scores)} score rows for {n} new tokens")
    for i, s in enumerate(out.scores):
        if not bool(torch.isfinite(s).all()):
            raise RuntimeError(f"{name}: non-finite logits at new token {i}")


def run_row(torch, model, name, batch, prompt, n1, n2, runs):
    model._decoding_cache = None  # a fresh graph and state for this batch size
    gc.collect()
    torch.cuda.empty_cache()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(1, 1000, (batch, prompt), dtype=torch.long, device="cuda", generator=gen)

    def timed(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(input_ids=ids, max_length=prompt + n, cg=True, return_dict_in_generate=True,
                             output_scores=True, enable_timing=False, top_k=1)
        torch.cuda.synchronize()
        return time.perf_counter() - t, out

    # The first call captures the step's graph for the longer max_length; calls of the shorter one reuse it.
    capture_s, out = timed(n2)
    check_output(torch, out, batch, prompt, n2, name)
    cache = model._decoding_cache
    graph_step = cache.callables[(batch, 1)]
    timed(n1)
    timed(n2)
    t1, t2 = [], []
    for _ in range(runs):
        s, out1 = timed(n1)
        t1.append(s)
        s, out2 = timed(n2)
        t2.append(s)
    if model._decoding_cache is not cache or list(cache.callables) != [(batch, 1)] \
            or cache.callables[(batch, 1)] is not graph_step:
        raise RuntimeError(f"{name}: the decode graph was captured again after the first call")
    check_output(torch, out1, batch, prompt, n1, name)
    check_output(torch, out2, batch, prompt, n2, name)
    same = bool(torch.equal(out1.sequences, out2.sequences[:, :prompt + n1]))
    m1, m2 = statistics.median(t1), statistics.median(t2)
    return {"ms_per_token": (m2 - m1) / (n2 - n1) * 1e3, "total_s": m2, "n1_s": t1, "n2_s": t2,
            "capture_call_s": capture_s, "same_tokens": same}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("--rows", default=",".join(r[0] for r in ROWS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None, help="file to append one JSON object per row to")
    ap.add_argument("--build", default=common.BUILD_DIR)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    wanted = args.rows.split(",")
    unknown = sorted(set(wanted) - {r[0] for r in ROWS})
    if unknown:
        sys.exit(f"--rows: unknown {unknown}; rows: {[r[0] for r in ROWS]}")

    build_s, conv_check = common.setup(args.src, args.build)
    print(f"causal_conv1d fwd + update: built (or reused) in {build_s:.1f} s; against the package's references: "
          f"{conv_check}", flush=True)
    if args.build_only:
        return
    import torch
    import triton
    prompt_scan = use_the_decode_kernels()
    device = torch.cuda.get_device_name()
    print(f"# {device}, torch {torch.__version__}, triton {triton.__version__}, mamba_ssm from {args.src}/mamba; "
          f"Mamba-1 prompt scan: {prompt_scan}", flush=True)

    model, model_shape = None, None  # one model on the GPU at a time
    for name, shape, batch, prompt, n1, n2 in ROWS:
        if name not in wanted:
            continue
        row = {"row": name, "model": shape, "batch": batch, "prompt": prompt, "n1": n1, "n2": n2,
               "state_dtype": "bf16", "device": device, "conv_check": conv_check}
        try:
            if shape != model_shape:
                model, model_shape = None, None
                gc.collect()
                torch.cuda.empty_cache()
                model, model_shape = common.make_model(shape), shape
            row.update(run_row(torch, model, name, batch, prompt, n1, n2, args.runs))
            print(f"mamba_ssm {name:<12} b{batch:<4} p{prompt:<4} {row['ms_per_token']:8.4f} ms/token  "
                  f"total {row['total_s']:.4f} s (P + {n2})  N1 {n1}: {statistics.median(row['n1_s']):.4f} s  "
                  f"first call {row['capture_call_s']:.2f} s  same tokens: {'yes' if row['same_tokens'] else 'NO'}",
                  flush=True)
        except Exception as e:  # one row's failure is reported and the others still run
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"mamba_ssm {name:<12} failed: {row['error']}", flush=True)
            if model is not None:
                model._decoding_cache = None
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
