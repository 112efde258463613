#!/usr/bin/env python3
"""The anchor of issue 14's prefill rows: mamba_ssm's fused forward on the same GPU as mambacpp, in the same job.

MambaLMHeadModel with random bf16 weights of a real shape (Mamba2 mixers on their default memory-efficient path:
causal_conv1d's CUDA conv, the Triton SSD chunk scan, the Triton gated RMSNorm, then out_proj), one forward over
the prompt with only the last token's logits (`num_last_tokens=1`, as `mambacpp bench` does), under
`torch.inference_mode`. Prints one line per row, in gpu_prefill_bench.sh's format:
    row-name  prefill_ms  tokens/s
(median of --runs timed forwards after two untimed ones: the first autotunes the Triton kernels).

No mamba_ssm can be installed on the GPU machine, so its sources travel with the tree (ignored folder SRC):
    SRC/mamba        state-spaces/mamba at e9594ce (issue 13's anchor version; only the Python package is used:
                     the Mamba-2 path needs no compiled extension of its own)
    SRC/causal-conv1d  Dao-AILab/causal-conv1d at 0d2252d (its CUDA extension is built here, for sm_90 only, into
                     --build: 7 minutes on 16 cores beside mambacpp's build and tests; reused while the machine is up)
    SRC/einops       arogozhnikov/einops (pure Python)
e.g. `git -C MAMBA_CLONE archive e9594ce mamba_ssm | tar -x -C SRC/mamba`, likewise `causal_conv1d csrc` and `einops`.
Usage: mamba_ssm_prefill_anchor.py SRC [ROWS] [--runs N] [--build DIR]    ROWS: all (default) | main
"""
import argparse
import os
import statistics
import sys


def build_causal_conv1d(src, build_dir):
    from torch.utils import cpp_extension
    csrc = os.path.join(src, "causal-conv1d", "csrc")
    os.makedirs(build_dir, exist_ok=True)
    # The package's own nvcc flags (its setup.py), for Hopper only.
    flags = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
             "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
             "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
             "-gencode=arch=compute_90,code=sm_90"]
    sources = [os.path.join(csrc, f) for f in
               ("causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu", "causal_conv1d_update.cu")]
    module = cpp_extension.load(name="causal_conv1d_cuda", sources=sources, extra_cflags=["-O3"],
                                extra_cuda_cflags=flags, build_directory=build_dir, verbose=False)
    sys.modules["causal_conv1d_cuda"] = module


SHAPES = {  # mamba_ssm's published configs (d_model, n_layer); vocab 50277 padded to 50280
    "mamba2-2.7b": (2560, 64),
    "mamba2-130m": (768, 24),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("rows", nargs="?", default="all", choices=["all", "main"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--build", default="/tmp/causal_conv1d_build")
    args = ap.parse_args()

    sys.path[:0] = [os.path.join(args.src, "mamba"), os.path.join(args.src, "causal-conv1d"),
                    os.path.join(args.src, "einops")]
    import torch
    build_causal_conv1d(args.src, args.build)
    from causal_conv1d.cpp_functions import causal_conv1d_fwd_function
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    from mamba_ssm.ops.triton import ssd_combined
    # The fused path runs only with the CUDA conv; say so rather than time a slower fallback.
    assert causal_conv1d_fwd_function is not None and ssd_combined.causal_conv1d_fwd_function is not None

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, mamba_ssm from {args.src}/mamba", flush=True)
    rows = [("2.7b 4k", "mamba2-2.7b", 1, 4096), ("2.7b 16k", "mamba2-2.7b", 1, 16384)]
    if args.rows == "all":
        rows += [("2.7b b32x512", "mamba2-2.7b", 32, 512), ("mamba2-130m 4k", "mamba2-130m", 1, 4096)]
    model, model_shape = None, None  # one model on the GPU at a time
    for name, shape, batch, prompt in rows:
        if shape != model_shape:
            model = None
            torch.cuda.empty_cache()
            d_model, n_layer = SHAPES[shape]
            cfg = MambaConfig(d_model=d_model, n_layer=n_layer, vocab_size=50277, ssm_cfg={"layer": "Mamba2"},
                              rms_norm=True, residual_in_fp32=True, fused_add_norm=True)
            torch.manual_seed(0)
            model, model_shape = MambaLMHeadModel(cfg, device="cuda", dtype=torch.bfloat16).eval(), shape
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
