"""Side-by-side CPU benchmark: blocklab vs a plain PyTorch floor vs HF transformers (fp32).

Every figure that matters is a *ratio measured in one run*: the implementations run
interleaved (A B C A B C ...) after a warm-up, a ratio is taken per round, and the report gives
min / median / max over the rounds (docs/performance.md).

1. Train step (forward + backward + AdamW) for the ``gpt2_tiny`` and ``llama_tiny`` presets,
   composed from configs/ exactly as the CLI does, against a plain PyTorch model of the same
   shapes and HF ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` (sdpa), plus the fp32 matmul rate
   measured in the same rounds (achieved FLOP/s fraction, FLOPs/token ≈ 6·N + 12·L·T·d with N
   the matmul weights: non-embedding parameters plus the LM head).
2. Cached greedy generation (prompt 64, 192 new tokens, batch 1 and 8): blocklab ``generate``
   vs HF ``generate`` vs a lean cached loop of the plain floor, and blocklab's cache speedup
   over full recompute (``use_cache=False``).
3. The compiled path, side by side with the eager rows (``--compile``, on by default except
   with ``--quick``): the train step of a ``torch.compile``-d blocklab model, and fixed-shape
   decoding, eager (``static_cache=True``) and compiled (``compile=True``); compilation happens
   in the warm-up round, never in a timed one.

Usage::

    .venv/bin/python scripts/bench_model.py --reps 5           # full run, several minutes
    .venv/bin/python scripts/bench_model.py --quick            # tiny shapes, CI smoke (< 60 s)
    .venv/bin/python scripts/bench_model.py --threads 1 --cpu-time   # stabler under load
    .venv/bin/python scripts/bench_model.py --only train --profile   # + torch.profiler tables
    .venv/bin/python scripts/bench_model.py --quick --compile         # + compiled rows, tiny
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
PRESETS = {"gpt": "gpt2_tiny", "llama": "llama_tiny"}


# ------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class Shape:
    """The dimensions every implementation of one preset shares (read from the composed config)."""

    name: str
    llama: bool  # RMSNorm + RoPE + SwiGLU + no biases + untied head; else GPT-2-like
    vocab: int
    d: int
    layers: int
    heads: int
    kv_heads: int
    d_ff: int
    max_seq: int
    norm_eps: float
    tied: bool
    rope_base: float

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every Linear of the stack + LM head."""
        hd = self.head_dim
        attn = self.d * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * self.d
        ffn = (3 if self.llama else 2) * self.d * self.d_ff
        return self.layers * (attn + ffn) + self.vocab * self.d

    def train_flops_per_token(self, seq: int) -> float:
        return 6 * self.matmul_params() + 12 * self.layers * seq * self.d


def quick_overrides(name: str) -> list[str]:
    d_ff = 172 if name == "llama" else 256
    return ["model.vocab_size=512", "model.d_model=64", "model.n_layers=2",
            f"model.d_ff={d_ff}", "model.max_seq_len=64"]


def compose_models(quick: bool) -> dict[str, object]:
    """Compose ``cfg.model`` for each preset from configs/ (Hydra, as the CLI does)."""
    from hydra import compose, initialize_config_dir

    from blocklab.config import register_configs

    register_configs()
    out = {}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name, preset in PRESETS.items():
            overrides = [f"model={preset}", *(quick_overrides(name) if quick else [])]
            out[name] = compose("estimate", overrides=overrides).model
    return out


def shape_of(name: str, model_cfg: object) -> Shape:
    from blocklab.config import model_config

    m = model_config(model_cfg)
    llama = m.position.name == "rope"
    expect = (("swiglu", "rmsnorm", False) if llama
              else ("gelu_mlp", "layernorm", True))
    got = (m.ffn.name, m.norm.name, m.ffn.bias and m.attention.bias)
    assert m.family.name == "decoder" and m.block.name == "pre", m
    assert got == expect and m.d_head is None and m.dropout == 0.0, (name, got)
    return Shape(name=name, llama=llama, vocab=m.vocab_size, d=m.d_model, layers=m.n_layers,
                 heads=m.n_heads, kv_heads=m.kv_heads, d_ff=m.d_ff, max_seq=m.max_seq_len,
                 norm_eps=m.norm.eps, tied=m.tie_embeddings, rope_base=m.position.base)


# ----------------------------------------------------------------------- plain PyTorch floor


class PlainBlock(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        bias = not s.llama
        self.s = s
        norm = (lambda: nn.RMSNorm(s.d, eps=s.norm_eps)) if s.llama else (
            lambda: nn.LayerNorm(s.d, eps=s.norm_eps))
        self.n1, self.n2 = norm(), norm()
        hd = s.head_dim
        self.qkv = nn.Linear(s.d, (s.heads + 2 * s.kv_heads) * hd, bias=bias)
        self.split = (s.heads * hd, s.kv_heads * hd, s.kv_heads * hd)
        self.proj = nn.Linear(s.heads * hd, s.d, bias=bias)
        self.fc = nn.Linear(s.d, (2 if s.llama else 1) * s.d_ff, bias=bias)  # gate|up for llama
        self.down = nn.Linear(s.d_ff, s.d, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                kv: tuple[Tensor, Tensor] | None, start: int) -> Tensor:
        s, (b, t, _) = self.s, x.shape
        q, k, v = self.qkv(self.n1(x)).split(self.split, dim=-1)
        q = q.view(b, t, s.heads, -1).transpose(1, 2)
        k = k.view(b, t, s.kv_heads, -1).transpose(1, 2)
        v = v.view(b, t, s.kv_heads, -1).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = q * cos + torch.cat((-q[..., s.head_dim // 2:], q[..., : s.head_dim // 2]), -1) * sin
            k = k * cos + torch.cat((-k[..., s.head_dim // 2:], k[..., : s.head_dim // 2]), -1) * sin
        if kv is not None:  # preallocated cache: write the new keys, attend over all so far
            kbuf, vbuf = kv
            kbuf[:, :, start:start + t] = k
            vbuf[:, :, start:start + t] = v
            k, v = kbuf[:, :, : start + t], vbuf[:, :, : start + t]
        assert t == 1 or start == 0
        o = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1,
                                           enable_gqa=s.kv_heads != s.heads)
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, -1))
        h = self.fc(self.n2(x))
        if s.llama:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return x + self.down(h)


class PlainLM(nn.Module):
    """The floor: fused QKV, SDPA ``is_causal``, tied head (gpt) / RoPE tables + GQA (llama)."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.s = s
        self.embed = nn.Embedding(s.vocab, s.d)
        self.pos = None if s.llama else nn.Embedding(s.max_seq, s.d)
        self.blocks = nn.ModuleList(PlainBlock(s) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.d, eps=s.norm_eps) if s.llama else nn.LayerNorm(s.d, eps=s.norm_eps)
        self.head = None if s.tied else nn.Linear(s.d, s.vocab, bias=False)
        if s.llama:
            inv = s.rope_base ** -(torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim)
            ang = torch.arange(s.max_seq, dtype=torch.float64)[:, None] * inv
            ang = torch.cat((ang, ang), -1).float()
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * s.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, ids: Tensor, cache: list[tuple[Tensor, Tensor]] | None = None,
                start: int = 0) -> Tensor:
        t = ids.shape[1]
        x = self.embed(ids)
        rope = None
        if self.pos is not None:
            x = x + self.pos.weight[start:start + t]
        else:
            rope = self.cos[start:start + t], self.sin[start:start + t]
        for i, block in enumerate(self.blocks):
            x = block(x, rope, None if cache is None else cache[i], start)
        x = self.norm(x)
        return F.linear(x, self.embed.weight) if self.head is None else self.head(x)

    def new_cache(self, batch: int, capacity: int) -> list[tuple[Tensor, Tensor]]:
        s, w = self.s, self.embed.weight
        shape = (batch, s.kv_heads, capacity, s.head_dim)
        return [(w.new_zeros(shape), w.new_zeros(shape)) for _ in range(s.layers)]


@torch.inference_mode()
def plain_generate(model: PlainLM, prompt: Tensor, new: int) -> Tensor:
    """Lean greedy loop: prefill once, then one token per step into preallocated K/V."""
    b, t = prompt.shape
    cache = model.new_cache(b, t + new)
    tok = model(prompt, cache, 0)[:, -1].argmax(-1)
    out = [tok]
    for i in range(new - 1):
        tok = model(tok[:, None], cache, t + i)[:, -1].argmax(-1)
        out.append(tok)
    return torch.stack(out, 1)


def load_blocklab_into_plain(plain: PlainLM, bl: nn.Module) -> None:
    """Copy blocklab weights into the floor (names mapped), to check they compute the same."""
    ren = {"decoder.position.table.": "pos.", "decoder.final_norm.": "norm.", "head.proj.": "head.",
           ".attn.qkv.": ".qkv.", ".attn.out.": ".proj.", ".ffn.up.": ".fc.",
           ".ffn.gate_up.": ".fc.", ".ffn.down.": ".down.", ".norms.0.": ".n1.",
           ".norms.1.": ".n2.", "decoder.blocks.": "blocks."}
    sd = {}
    for k, v in bl.state_dict().items():
        for a, b in ren.items():
            k = k.replace(a, b)
        sd[k] = v
    if plain.head is None:
        sd.pop("head.weight", None)
    plain.load_state_dict(sd, strict=True)


# ---------------------------------------------------------------------------- HF transformers


def hf_model(s: Shape) -> nn.Module:
    # eos_token_id=None: generate() cannot stop early, and min_new_tokens then adds no logits
    # processor (HF only masks EOS when one is set), so HF does exactly the greedy work.
    common = dict(vocab_size=s.vocab, bos_token_id=0, eos_token_id=None, pad_token_id=0,
                  tie_word_embeddings=s.tied, attn_implementation="sdpa")
    if s.llama:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=s.d, intermediate_size=s.d_ff, num_hidden_layers=s.layers,
                          num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                          max_position_embeddings=s.max_seq, rms_norm_eps=s.norm_eps,
                          attention_bias=False, mlp_bias=False, attention_dropout=0.0,
                          rope_theta=s.rope_base, **common)
        model = LlamaForCausalLM(cfg)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_positions=s.max_seq, n_embd=s.d, n_layer=s.layers, n_head=s.heads,
                         n_inner=s.d_ff, activation_function="gelu", resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=s.norm_eps, **common)
        model = GPT2LMHeadModel(cfg)
    assert model.config._attn_implementation == "sdpa"
    return model


# -------------------------------------------------------------------------------- measuring


def make_clock(cpu_time: bool) -> Callable[[], float]:
    return time.process_time if cpu_time else time.perf_counter


def interleave(cases: dict[str, Callable[[], object]], reps: int, warmup: int,
               clock: Callable[[], float]) -> dict[str, list[float]]:
    """Warm up every case, then time them round-robin; seconds per case per round."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(reps):
        wall = time.perf_counter()
        for k, fn in cases.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
        print(f"  round {r + 1}/{reps}: {time.perf_counter() - wall:.1f} s", file=sys.stderr,
              flush=True)
    return times


def mmm(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def fmt_mmm(xs: list[float], digits: int = 2) -> str:
    r = mmm(xs)
    return f"{r['min']:.{digits}f} / {r['median']:.{digits}f} / {r['max']:.{digits}f}"


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) parameters counted once


def lm_loss(logits: Tensor, ids: Tensor) -> Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def build_all(shape: Shape, model_cfg: object,
              compiled: bool = False) -> dict[str, tuple[nn.Module, Callable]]:
    """name -> (model, forward(ids) -> logits); same seed before each construction. With
    ``compiled``, also ``blocklab_compiled``: a second blocklab model whose forward is
    ``torch.compile``-d (default mode, automatic dynamic shapes)."""
    from blocklab.model import build_model

    torch.manual_seed(0)
    plain = PlainLM(shape)
    torch.manual_seed(0)
    bl = build_model(model_cfg)
    torch.manual_seed(0)
    hf = hf_model(shape)
    out = {"floor": (plain, plain), "blocklab": (bl, bl), "hf": (hf, lambda ids: hf(ids).logits)}
    if compiled:
        torch.manual_seed(0)
        blc = build_model(model_cfg)
        out["blocklab_compiled"] = (blc, torch.compile(blc))
    return out


def check_floor_matches(shape: Shape, model_cfg: object) -> float:
    """Max |logit difference| between blocklab and the floor given blocklab's weights."""
    from blocklab.model import build_model

    torch.manual_seed(1)
    bl = build_model(model_cfg).eval()
    plain = PlainLM(shape).eval()
    load_blocklab_into_plain(plain, bl)
    ids = torch.randint(shape.vocab, (2, min(32, shape.max_seq)))
    with torch.no_grad():
        return float((bl(ids) - plain(ids)).abs().max())


# ------------------------------------------------------------------------------------ train


def bench_train(shapes: dict[str, Shape], cfgs: dict[str, object], a: argparse.Namespace,
                clock: Callable[[], float]) -> dict:
    batch, seq, steps = a.batch, a.seq, a.steps
    tokens = batch * seq * steps
    cases: dict[str, Callable[[], object]] = {}
    info: dict[str, dict] = {}
    profiled: list[tuple[str, Callable[[], object]]] = []
    for sname, shape in shapes.items():
        torch.manual_seed(123)
        ids = torch.randint(shape.vocab, (batch, seq))
        for iname, (model, fwd) in build_all(shape, cfgs[sname], a.compile).items():
            model.train()
            with torch.no_grad():
                loss0 = float(lm_loss(fwd(ids), ids))
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

            def step(model=model, fwd=fwd, opt=opt, ids=ids) -> None:
                for _ in range(steps):
                    opt.zero_grad(set_to_none=True)
                    lm_loss(fwd(ids), ids).backward()
                    opt.step()

            cases[f"{sname}/{iname}"] = step
            info[f"{sname}/{iname}"] = {"params": n_params(model), "init_loss": loss0}
            if iname in ("floor", "blocklab"):
                profiled.append((f"{sname}/{iname}", step))
    mat_reps = {1024: 16, 2048: 2} if not a.quick else {1024: 2}
    mats = {n: (torch.randn(n, n), torch.randn(n, n)) for n in mat_reps}

    def matmul(n: int) -> Callable[[], None]:
        x, y = mats[n]
        out = torch.empty(n, n)
        return lambda: [torch.mm(x, y, out=out) for _ in range(mat_reps[n])]

    for n in mats:
        cases[f"matmul/{n}"] = matmul(n)
    print(f"train: {len(cases)} cases x {a.reps} rounds, {steps} step(s) of {batch}x{seq} tokens "
          "per case per round ...", flush=True)
    times = interleave(cases, a.reps, a.warmup, clock)

    rates = {n: [2 * n**3 * mat_reps[n] / t for t in times[f"matmul/{n}"]] for n in mats}
    peak = [max(r) for r in zip(*rates.values())]  # per round: the better of the two products
    unit = "CPU-s" if a.cpu_time else "s"
    res: dict = {"config": {"batch": batch, "seq": seq, "steps_per_round": steps},
                 "matmul_gflops": {str(n): mmm([r / 1e9 for r in rs]) for n, rs in rates.items()},
                 "shapes": {}}
    print(f"\n== train step (fwd + bwd + AdamW), fp32, batch {batch} x {seq}, {a.reps} rounds, "
          f"{a.threads} thread(s), tokens per {'CPU-second' if a.cpu_time else 'second'}")
    print(f"fp32 matmul GFLOP/{unit} min/med/max: "
          + ", ".join(f"{n}^2 {fmt_mmm([r / 1e9 for r in rs], 0)}" for n, rs in rates.items()))
    hdr = (f"{'shape':6} {'impl':17} {'params':>10} {'init loss':>9} {'tok/s med':>10} "
           f"{'vs floor min/med/max':>22} {'FLOP/s frac med':>15}")
    print(hdr)
    print("-" * len(hdr))
    for sname, shape in shapes.items():
        fpt = shape.train_flops_per_token(seq)
        floor_tps = [tokens / t for t in times[f"{sname}/floor"]]
        sres = {"flops_per_token": fpt, "matmul_params": shape.matmul_params(), "impls": {}}
        for iname in ("floor", "blocklab", "blocklab_compiled", "hf"):
            key = f"{sname}/{iname}"
            if key not in times:
                continue
            tps = [tokens / t for t in times[key]]
            ratio = [x / f for x, f in zip(tps, floor_tps)]
            frac = [x * fpt / p for x, p in zip(tps, peak)]
            sres["impls"][iname] = {**info[key], "seconds": times[key],
                                    "tokens_per_s": mmm(tps), "ratio_to_floor": mmm(ratio),
                                    "flops_fraction": mmm(frac)}
            print(f"{sname:6} {iname:17} {info[key]['params']:>10,} {info[key]['init_loss']:>9.3f} "
                  f"{statistics.median(tps):>10,.0f} {fmt_mmm(ratio):>22} "
                  f"{statistics.median(frac):>15.1%}")
        if f"{sname}/blocklab_compiled" in times:
            speedup = [e / c for c, e in zip(times[f"{sname}/blocklab_compiled"],
                                             times[f"{sname}/blocklab"])]
            sres["compiled_speedup"] = mmm(speedup)
            print(f"{sname:6} compiled train step over eager blocklab min/med/max: "
                  f"{fmt_mmm(speedup)}x")
        res["shapes"][sname] = sres
    print("FLOPs/token = 6*N + 12*L*T*d, N = matmul weights (stack Linears + LM head): "
          + ", ".join(f"{k} N={s.matmul_params():,} -> {s.train_flops_per_token(seq) / 1e6:.1f} M"
                      for k, s in shapes.items()))
    if a.profile:
        profile_cases(profiled, a.profile_rows)
    return res


# ------------------------------------------------------------------------------- generation


def bench_generate(shapes: dict[str, Shape], cfgs: dict[str, object], a: argparse.Namespace,
                   clock: Callable[[], float]) -> dict:
    from blocklab.model.generate import generate

    prompt_len, new = a.prompt, a.new
    res: dict = {"config": {"prompt": prompt_len, "new_tokens": new}, "runs": {}}
    cases: dict[str, Callable[[], object]] = {}
    profiled: list[tuple[str, Callable[[], object]]] = []
    for sname, shape in shapes.items():
        assert prompt_len + new <= shape.max_seq
        models = {k: m.eval() for k, (m, _) in build_all(shape, cfgs[sname]).items()}
        hf = models["hf"]
        for batch in a.gen_batches:
            torch.manual_seed(7)
            prompt = torch.randint(1, shape.vocab, (batch, prompt_len))
            mask = torch.ones_like(prompt)
            key = f"{sname}/b{batch}"

            def run_floor(m=models["floor"], p=prompt) -> Tensor:
                return plain_generate(m, p, new)

            def run_bl(m=models["blocklab"], p=prompt, use_cache: bool = True,
                       **kw: object) -> Tensor:
                with torch.no_grad():
                    return generate(m, p, max_new_tokens=new, use_cache=use_cache, **kw)

            def run_hf(hf=hf, p=prompt, mask=mask) -> Tensor:
                with torch.no_grad():
                    return hf.generate(p, attention_mask=mask, max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False, use_cache=True,
                                       pad_token_id=0)[:, prompt_len:]

            for name, fn in (("floor", run_floor), ("blocklab", run_bl), ("hf", run_hf)):
                out = fn()
                assert out.shape == (batch, new), (key, name, tuple(out.shape))
            # The cache must not change the greedy result (fp32: allow a rare argmax tie flip).
            eager = run_bl()
            same = float((eager == run_bl(use_cache=False)).float().mean())
            cases[f"{key}/floor"] = run_floor
            cases[f"{key}/blocklab"] = run_bl
            cases[f"{key}/hf"] = run_hf
            if a.compile:
                cases[f"{key}/blocklab_static"] = lambda f=run_bl: f(static_cache=True)
                cases[f"{key}/blocklab_compiled"] = lambda f=run_bl: f(compile=True)
                res["runs"][key] = {"compiled_agrees_with_eager": float(
                    (run_bl(compile=True) == eager).float().mean())}
            if not a.no_recompute:
                cases[f"{key}/blocklab_nocache"] = lambda f=run_bl: f(use_cache=False)
            res["runs"].setdefault(key, {})["cache_agrees_with_recompute"] = same
            if batch == 1:
                profiled.append((f"{key}/blocklab", run_bl))
                profiled.append((f"{key}/floor", run_floor))
    print(f"\ngenerate: {len(cases)} cases x {a.reps} rounds ...", flush=True)
    times = interleave(cases, a.reps, a.warmup, clock)

    print(f"\n== cached greedy generation, fp32, prompt {prompt_len} + {new} new tokens, "
          f"{a.reps} rounds, {a.threads} thread(s), new tokens per "
          f"{'CPU-second' if a.cpu_time else 'second'}")
    hdr = (f"{'shape':6} {'batch':>5} {'impl':16} {'tok/s med':>10} {'vs HF min/med/max':>20} "
           f"{'vs floor min/med/max':>22}")
    print(hdr)
    print("-" * len(hdr))
    for key, run in res["runs"].items():
        sname, b = key.split("/")
        batch = int(b[1:])
        tps = {i: [batch * new / t for t in times[f"{key}/{i}"]]
               for i in ("floor", "blocklab", "blocklab_static", "blocklab_compiled",
                         "blocklab_nocache", "hf") if f"{key}/{i}" in times}
        run["impls"] = {}
        for iname, xs in tps.items():
            vs_hf = [x / h for x, h in zip(xs, tps["hf"])]
            vs_floor = [x / f for x, f in zip(xs, tps["floor"])]
            run["impls"][iname] = {"seconds": times[f"{key}/{iname}"], "tokens_per_s": mmm(xs),
                                   "ratio_to_hf": mmm(vs_hf), "ratio_to_floor": mmm(vs_floor)}
            print(f"{sname:6} {batch:>5} {iname:16} {statistics.median(xs):>10,.0f} "
                  f"{fmt_mmm(vs_hf):>20} {fmt_mmm(vs_floor):>22}")
        if "blocklab_nocache" in tps:
            speedup = [c / r for c, r in zip(tps["blocklab"], tps["blocklab_nocache"])]
            run["blocklab_cache_speedup"] = mmm(speedup)
            print(f"{'':6} {'':>5} blocklab cache speedup over full recompute min/med/max: "
                  f"{fmt_mmm(speedup)}x (greedy tokens equal: {run['cache_agrees_with_recompute']:.0%})")
        if "blocklab_compiled" in tps:
            speedup = [c / e for c, e in zip(tps["blocklab_compiled"], tps["blocklab"])]
            run["compiled_speedup"] = mmm(speedup)
            print(f"{'':6} {'':>5} compiled static-cache decoding over eager min/med/max: "
                  f"{fmt_mmm(speedup)}x (greedy tokens equal: "
                  f"{run['compiled_agrees_with_eager']:.0%})")
    if a.profile:
        profile_cases(profiled, a.profile_rows)
    return res


# -------------------------------------------------------------------------------- profiling


def profile_cases(cases: list[tuple[str, Callable[[], object]]], rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    for name, fn in cases:
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\n-- torch.profiler: {name} (self CPU time, top {rows})")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, 3 rounds: a CI smoke (< 60 s)")
    p.add_argument("--reps", type=int, default=None, help="timed interleaved rounds (default 5; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default 2; 1 with --quick, robust on a loaded CI box)")
    p.add_argument("--only", choices=("train", "generate"), default=None)
    p.add_argument("--json", type=Path, default=None, help="write all results (raw times too) here")
    p.add_argument("--cpu-time", action="store_true",
                   help="time with process CPU time (all threads) instead of wall clock")
    p.add_argument("--steps", type=int, default=None, help="train steps per case per round (default 2)")
    p.add_argument("--no-recompute", action="store_true",
                   help="skip blocklab's full-recompute generation (the slowest case)")
    p.add_argument("--profile", action="store_true", help="also print torch.profiler tables")
    p.add_argument("--profile-rows", type=int, default=20)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compiled train and static-cache decode rows (default: on, off with "
                        "--quick)")
    a = p.parse_args(argv)
    if a.compile is None:
        a.compile = not a.quick
    if a.quick:
        a.reps = a.reps or 3
        a.threads = a.threads or 1
        a.batch, a.seq, a.steps = 2, 64, a.steps or 1
        a.prompt, a.new, a.gen_batches = 16, 24, (1, 2)
    else:
        a.reps = a.reps or 5
        a.threads = a.threads or 2
        a.batch, a.seq, a.steps = 8, 256, a.steps or 2
        a.prompt, a.new, a.gen_batches = 64, 192, (1, 8)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    clock = make_clock(a.cpu_time)
    t_start = time.perf_counter()
    import transformers

    cfgs = compose_models(a.quick)
    shapes = {k: shape_of(k, c) for k, c in cfgs.items()}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} thread(s), clock: "
          f"{'process CPU time' if a.cpu_time else 'perf_counter'}, rounds {a.reps} "
          f"(+{a.warmup} warm-up), {'quick' if a.quick else 'full'} shapes")
    for k, s in shapes.items():
        diff = check_floor_matches(s, cfgs[k])
        print(f"{k}: {PRESETS[k]} -> {s}; floor vs blocklab logits, same weights: max|diff| {diff:.1e}")
        assert diff < 1e-4, f"the plain floor does not compute what blocklab does ({k}: {diff})"
    results: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                     "torch": torch.__version__, "transformers": transformers.__version__,
                     "shapes": {k: asdict(s) for k, s in shapes.items()}}
    if a.only in (None, "train"):
        results["train"] = bench_train(shapes, cfgs, a, clock)
    if a.only in (None, "generate"):
        results["generate"] = bench_generate(shapes, cfgs, a, clock)
    results["elapsed_s"] = time.perf_counter() - t_start
    print(f"\ntotal {results['elapsed_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
