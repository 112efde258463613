"""A compact Mamba-2 language model for training, with transformers' parameter names so that its state_dict loads
into transformers' Mamba2ForCausalLM unchanged.

Why not train transformers' own module: without the mamba_ssm kernels its PyTorch path materialises
[batch, chunks, chunk, chunk, heads, state] products, which is slow and memory-hungry at training sizes. Here the
chunked SSD scan is written with einsum contractions instead (same maths: intra-chunk quadratic form, per-chunk
states, inter-chunk recurrence). The training script asserts that this module and transformers agree on a batch.

Supports what the shipped model uses: rms_norm, norm_before_gate = False, no in/out projection bias, any n_groups.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def segment_sums(a):
    """a: [..., T] -> [..., T, T] with out[..., i, j] = a[j+1] + ... + a[i] for j <= i and -inf above the diagonal.

    Summing the segments directly (rather than differencing two running sums) keeps precision when |cumsum| is large.
    """
    t = a.shape[-1]
    x = a[..., None].expand(*a.shape, t)  # x[..., k, j] = a[k]
    strictly_lower = torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device), diagonal=-1)
    x = x.masked_fill(~strictly_lower, 0.0)
    sums = torch.cumsum(x, dim=-2)  # sums[..., i, j] = sum of a[k] for j < k <= i
    lower = torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device), diagonal=0)
    return sums.masked_fill(~lower, float("-inf"))


def ssd_scan(x, a, b, c, chunk):
    """Chunked state-space-dual scan from a zero state.

    x: [B, L, H, P] (already multiplied by dt), a: [B, L, H] (dt * A), b, c: [B, L, H, N]. Returns y: [B, L, H, P]
    with y_t = sum_{s <= t} exp(a_{s+1} + ... + a_t) (c_t . b_s) x_s.
    """
    bsz, length, heads, _ = x.shape
    pad = (-length) % chunk
    if pad:
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        a = F.pad(a, (0, 0, 0, pad))
    n_chunks = (length + pad) // chunk
    x = x.reshape(bsz, n_chunks, chunk, heads, -1)              # [B, C, Q, H, P]
    b = b.reshape(bsz, n_chunks, chunk, heads, -1)              # [B, C, Q, H, N]
    c = c.reshape(bsz, n_chunks, chunk, heads, -1)
    a = a.reshape(bsz, n_chunks, chunk, heads).permute(0, 3, 1, 2)  # [B, H, C, Q]
    a_cum = torch.cumsum(a, dim=-1)

    # 1. Within each chunk: a causal, decay-weighted quadratic form.
    decay = torch.exp(segment_sums(a))                           # [B, H, C, Q(l), Q(s)]
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, decay, x)

    # 2. The state each chunk adds, decayed to the chunk's end.
    to_end = torch.exp(a_cum[..., -1:] - a_cum)                 # [B, H, C, Q]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, to_end, x)

    # 3. Carry states across chunks (state entering chunk z = decayed sum of earlier chunks' contributions).
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)  # [B, C+1, H, P, N]
    chunk_decay = torch.exp(segment_sums(F.pad(a_cum[..., -1], (1, 0))))  # [B, H, C+1, C+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)[:, :-1]

    # 4. What the carried-in state contributes inside each chunk.
    from_start = torch.exp(a_cum)                                # [B, H, C, Q]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, from_start)

    y = (y_diag + y_off).reshape(bsz, n_chunks * chunk, heads, -1)
    return y[:, :length]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, h):  # [..., dim]
        dtype = h.dtype
        h = h.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class GatedRMSNorm(nn.Module):
    """y * silu(z), then RMS-normalised per group of `group` channels (mamba_ssm's form), times weight."""

    def __init__(self, dim, group, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group = group
        self.variance_epsilon = eps

    def forward(self, y, z):  # [B, L, dim] each
        h = y.float() * F.silu(z.float())
        shape = h.shape
        h = h.reshape(*shape[:-1], shape[-1] // self.group, self.group)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.reshape(shape)


class Mixer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.hidden = cfg.hidden_size
        self.d_inner = int(cfg.expand * cfg.hidden_size)
        self.heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.groups = cfg.n_groups
        self.state = cfg.state_size
        self.chunk = cfg.chunk_size
        self.kernel = cfg.conv_kernel
        lo, hi = cfg.time_step_limit
        self.dt_limit = None if (lo == 0.0 and math.isinf(hi)) else (lo, hi)
        assert self.heads * self.head_dim == self.d_inner and self.heads % self.groups == 0
        assert not cfg.use_bias, "in/out projection biases are not needed for the shipped model"
        conv_dim = self.d_inner + 2 * self.groups * self.state
        self.in_proj = nn.Linear(self.hidden, self.d_inner + conv_dim + self.heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, self.kernel, groups=conv_dim, padding=self.kernel - 1,
                                bias=cfg.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.groups, cfg.layer_norm_epsilon)
        self.out_proj = nn.Linear(self.d_inner, self.hidden, bias=False)

    def forward(self, u):  # [B, L, hidden]
        bsz, length, _ = u.shape
        gn = self.groups * self.state
        z, xbc, dt = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * gn, self.heads], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :length].transpose(1, 2))
        x, b, c = xbc.split([self.d_inner, gn, gn], dim=-1)
        with torch.autocast(device_type=u.device.type, enabled=False):
            x = x.float().reshape(bsz, length, self.heads, self.head_dim)
            rep = self.heads // self.groups
            b = b.float().reshape(bsz, length, self.groups, self.state).repeat_interleave(rep, dim=2)
            c = c.float().reshape(bsz, length, self.groups, self.state).repeat_interleave(rep, dim=2)
            dt = F.softplus(dt.float() + self.dt_bias.float())  # [B, L, H]
            if self.dt_limit is not None:
                dt = dt.clamp(*self.dt_limit)
            a = -torch.exp(self.A_log.float())
            y = ssd_scan(x * dt[..., None], dt * a, b, c, self.chunk) + x * self.D.float()[:, None]
            y = self.norm(y.reshape(bsz, length, self.d_inner), z)
        return self.out_proj(y)  # under autocast this matmul runs in bf16


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        self.mixer = Mixer(cfg)

    def forward(self, h):  # residual stream kept in fp32
        return h + self.mixer(self.norm(h)).float()


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)


class TinyMamba2LM(nn.Module):
    """Parameter names match transformers' Mamba2ForCausalLM (backbone.*, lm_head.weight)."""

    def __init__(self, cfg):
        super().__init__()
        self.backbone = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def forward(self, ids):  # [B, L] -> logits [B, L, vocab]
        h = self.backbone.embeddings(ids).float()
        for layer in self.backbone.layers:
            h = layer(h)
        return self.lm_head(self.backbone.norm_f(h))

    @torch.no_grad()
    def init_weights(self, cfg, seed):
        """mamba_ssm-style init: small embeddings, default linear/conv init, out_proj scaled down with depth,
        A = -U(1, 16), dt log-uniform in [time_step_min, time_step_max] through the inverse softplus, D = 1."""
        gen = torch.Generator().manual_seed(seed)
        self.backbone.embeddings.weight.normal_(0.0, 0.02, generator=gen)
        for layer in self.backbone.layers:
            m = layer.mixer
            m.A_log.copy_(torch.log(1.0 + 15.0 * torch.rand(m.heads, generator=gen)))
            lo, hi = math.log(cfg.time_step_min), math.log(cfg.time_step_max)
            dt = torch.exp(torch.rand(m.heads, generator=gen) * (hi - lo) + lo).clamp(min=cfg.time_step_floor)
            m.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            m.D.fill_(1.0)
            m.out_proj.weight.div_(math.sqrt(cfg.num_hidden_layers))
