"""What the mamba_ssm anchors share (dev/mamba_ssm_prefill_anchor.py, dev/mamba_ssm_decode_anchor.py): the import
path of mamba_ssm's travelling sources, causal-conv1d's CUDA kernels built on the GPU machine, and the model shapes.

No mamba_ssm can be installed on the GPU machine, so its sources travel with the tree (ignored folder SRC, e.g.
.deps/anchor_src):
    SRC/mamba          state-spaces/mamba at e9594ce (issue 13's anchor version), the Python package only
    SRC/causal-conv1d  Dao-AILab/causal-conv1d at 0d2252d: its Python package and csrc/
    SRC/einops         arogozhnikov/einops at v0.8.2 (pure Python)
made with the search tool's `fetch` (or any clone) and `git archive`:
    git -C MAMBA archive e9594ce mamba_ssm | tar -x -C SRC/mamba
    git -C CAUSAL_CONV1D archive 0d2252d causal_conv1d csrc | tar -x -C SRC/causal-conv1d
    git -C EINOPS archive v0.8.2 einops | tar -x -C SRC/einops

causal-conv1d's extension (the module `causal_conv1d_cuda` its cpp_functions.py imports) is built for sm_90 only, with
the package's nvcc flags, from its own binding (csrc/causal_conv1d.cpp: causal_conv1d_fwd, causal_conv1d_bwd,
causal_conv1d_update, the names cpp_functions.py calls) and the forward and update kernels; the backward launchers
the binding refers to are errors (dev/causal_conv1d_no_bwd.cpp), which spares causal_conv1d_bwd.cu, most of the full
build's ~7 minutes. Then the kernels are checked against the package's references (causal_conv1d_ref,
causal_conv1d_update_ref) in both layouts the mixers use, before any model runs; the anchors print the verdict.
"""
import os
import sys
import time

# mamba_ssm's published configs (d_model, n_layer, mixer); vocab 50277 padded to 50280, rms_norm, residual in fp32,
# fused add+norm, tied embeddings: the shapes mambacpp's `--shape` names (src/model/shapes.cpp).
SHAPES = {
    "mamba2-130m": (768, 24, "Mamba2"),
    "mamba2-2.7b": (2560, 64, "Mamba2"),
    "mamba-2.8b": (2560, 64, "Mamba1"),
}

BUILD_DIR = "/tmp/causal_conv1d_fwd_update"  # both anchors' default: the second one reuses the first one's build

_BINDING_NAMES = ("causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update")


def add_sources_to_path(src):
    for sub in ("mamba", "causal-conv1d", "einops"):
        path = os.path.join(src, sub)
        if not os.path.isdir(path):
            sys.exit(f"{path}: missing (the anchor's sources; see dev/mamba_ssm_anchor_common.py for how to make them)")
        sys.path.insert(0, path)


def build_causal_conv1d(src, build_dir):
    """Builds (or reuses, when nothing changed) the fwd + update extension; returns the module and the seconds."""
    from torch.utils import cpp_extension
    csrc = os.path.join(src, "causal-conv1d", "csrc")
    os.makedirs(build_dir, exist_ok=True)
    # The package's own nvcc flags (its setup.py), for Hopper only (an -arch flag here replaces torch's defaults).
    flags = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
             "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
             "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
             "-gencode=arch=compute_90,code=sm_90"]
    sources = [os.path.join(csrc, f) for f in ("causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_update.cu")]
    sources.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "causal_conv1d_no_bwd.cpp"))
    t0 = time.perf_counter()
    module = cpp_extension.load(name="causal_conv1d_cuda", sources=sources, extra_cflags=["-O3"],
                                extra_cuda_cflags=flags, extra_include_paths=[csrc], build_directory=build_dir,
                                verbose=False)
    seconds = time.perf_counter() - t0
    missing = [n for n in _BINDING_NAMES if not hasattr(module, n)]
    if missing:
        raise RuntimeError(f"causal_conv1d_cuda built from {sources} lacks {missing}")
    sys.modules["causal_conv1d_cuda"] = module
    return module, seconds


def check_causal_conv1d():
    """The built kernels against the package's references: fwd in the (batch, dim, len) layout Mamba-1 passes and the
    channel-last one Mamba-2 passes, update on a contiguous state (Mamba-1's) and a transposed one (Mamba-2's)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    batch, dim, seqlen, width = 2, 64, 37, 4
    weight, bias = rnd(dim, width), rnd(dim)
    # f32 throughout, the references' F.conv1d without TF32: a wrong stride, layout or weight is off by O(1), rounding
    # by ~1e-6.
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        _check_against_references(rnd, weight, bias, batch, dim, seqlen, width)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _check_against_references(rnd, weight, bias, batch, dim, seqlen, width):
    import torch
    from causal_conv1d.causal_conv1d_interface import (causal_conv1d_fn, causal_conv1d_ref, causal_conv1d_update,
                                                       causal_conv1d_update_ref)
    with torch.inference_mode():
        for name, x in (("fwd", rnd(batch, dim, seqlen)), ("fwd channel-last", rnd(batch, seqlen, dim).transpose(1, 2))):
            got = causal_conv1d_fn(x, weight, bias, activation="silu")
            want = causal_conv1d_ref(x, weight, bias, activation="silu")
            err = (got - want).abs().max().item()
            if not err < 1e-3:
                raise RuntimeError(f"causal_conv1d {name}: max |error| {err} against causal_conv1d_ref")
        for name, state in (("update", rnd(batch, dim, width)),
                            ("update transposed state", rnd(batch, width, dim).transpose(1, 2))):
            x, ref_state = rnd(batch, dim), state.clone()
            got = causal_conv1d_update(x, state, weight, bias, activation="silu")
            want = causal_conv1d_update_ref(x, ref_state, weight, bias, activation="silu")
            err = max((got - want).abs().max().item(), (state - ref_state).abs().max().item())
            if not err < 1e-3:
                raise RuntimeError(f"causal_conv1d {name}: max |error| {err} against causal_conv1d_update_ref")


def setup(src, build_dir):
    """sys.path, the extension built and checked; call before importing mamba_ssm. Returns the build's seconds and
    the check's verdict, "ok" or "FAILED: why": a failed check is reported with every row rather than stopping the
    job, which may be the only GPU run of the day (the speed of a wrongly bound conv is still its kernels')."""
    add_sources_to_path(src)
    _, seconds = build_causal_conv1d(src, build_dir)
    try:
        check_causal_conv1d()
        verdict = "ok"
    except Exception as e:  # noqa: BLE001 (any failure of the check, reported below and with every row)
        verdict = f"FAILED: {type(e).__name__}: {e}"
    return seconds, verdict


def make_model(shape, dtype=None):
    """MambaLMHeadModel of random weights (mamba_ssm's own initialization, seed 0) on the GPU, in eval mode."""
    import torch
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    d_model, n_layer, layer = SHAPES[shape]
    cfg = MambaConfig(d_model=d_model, n_layer=n_layer, vocab_size=50277, ssm_cfg={"layer": layer},
                      rms_norm=True, residual_in_fp32=True, fused_add_norm=True)
    torch.manual_seed(0)
    return MambaLMHeadModel(cfg, device="cuda", dtype=dtype or torch.bfloat16).eval()
