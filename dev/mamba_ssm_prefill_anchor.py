#!/usr/bin/env python3
"""The anchor of issue 14's prefill rows: mamba_ssm's fused forward on the same GPU as mambacpp, in the same job.

MambaLMHeadModel with random bf16 weights of a real shape (Mamba2 mixers on their default memory-efficient path:
causal_conv1d's CUDA conv, the Triton SSD chunk scan, the Triton gated RMSNorm, then out_proj), one forward over
the prompt with only the last token's logits (`num_last_tokens=1`, as `mambacpp bench` does), under
`torch.inference_mode`. Prints one line per row, in gpu_prefill_bench.sh's format:
    row-name  prefill_ms  tokens/s
(median of --runs timed forwards after two untimed ones: the first autotunes the Triton kernels).

mamba_ssm's sources travel with the tree (ignored folder SRC) and causal-conv1d's forward and update kernels are
built here for sm_90 into --build (a minute or two on 16 cores; reused while the machine is up): the header of
dev/mamba_ssm_anchor_common.py says how SRC is made and what is built.
Usage: mamba_ssm_prefill_anchor.py SRC [ROWS] [--runs N] [--build DIR]    ROWS: all (default) | main
"""
import argparse
import statistics

import mamba_ssm_anchor_common as common


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("rows", nargs="?", default="all", choices=["all", "main"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--build", default=common.BUILD_DIR)
    args = ap.parse_args()

    _, conv_check = common.setup(args.src, args.build)
    import torch
    from causal_conv1d.cpp_functions import causal_conv1d_fwd_function
    from mamba_ssm.ops.triton import ssd_combined
    # The fused path runs only with the CUDA conv; say so rather than time a slower fallback.
    assert causal_conv1d_fwd_function is not None and ssd_combined.causal_conv1d_fwd_function is not None

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, mamba_ssm from {args.src}/mamba; "
          f"causal_conv1d against the package's references: {conv_check}", flush=True)
    rows = [("2.7b 4k", "mamba2-2.7b", 1, 4096), ("2.7b 16k", "mamba2-2.7b", 1, 16384)]
    if args.rows == "all":
        rows += [("2.7b b32x512", "mamba2-2.7b", 32, 512), ("mamba2-130m 4k", "mamba2-130m", 1, 4096)]
    model, model_shape = None, None  # one model on the GPU at a time
    for name, shape, batch, prompt in rows:
        if shape != model_shape:
            model = None
            torch.cuda.empty_cache()
            model, model_shape = common.make_model(shape), shape
        ids = torch.randint(0, 50277, (batch, prompt), device="cuda")
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        with torch.inference_mode():
            for i in range(args.runs + 2):
                start.record()
                logits = model(ids, num_last_tokens=1).logits
                stop.record()
                torch.cuda.synchronize()
                assert torch.isfinite(logits).all(), f"{name}: non-finite logits"
                if i >= 2:
                    times.append(start.elapsed_time(stop))
        ms = statistics.median(times)
        print(f"mamba_ssm {name:<24} {ms:9.2f} ms {batch * prompt / ms * 1e3:10.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
