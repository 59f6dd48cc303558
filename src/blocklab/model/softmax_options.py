"""The softmax mixer's options (``SoftmaxOptions``, ``model.mixer.<option>``) and their rules:
their values (``SoftmaxAttention.check_options``) and the window pattern against the stacks
(``SoftmaxAttention.check``), kept beside attention.py so that file stays one readable file
and everything that reads a softmax option (masks, the estimator, conversions) imports it from
here without importing the mixer."""

from __future__ import annotations

from dataclasses import dataclass, field

from blocklab.config import ModelConfig
from blocklab.config.checks import finite, require

#: the entries of ``model.mixer.layers``
LAYER_KINDS = ("global", "local")
#: ``model.mixer.qk_norm_scope``: one norm of width d_head (every head) or over all heads
QK_NORM_SCOPES = ("head", "all")


@dataclass
class SoftmaxOptions:
    """The ``softmax`` mixer's options (``model.mixer.<option>``). Cross-attention of an
    encoder–decoder is softmax attention too: it reads ``scale``, ``dropout``, ``qk_norm``,
    ``qk_norm_scope`` and ``softcap``, so these options are in use whenever a model has
    cross-attention."""

    # sliding-window self-attention: keys per query, the query included (null = global; odd
    # in a bidirectional stack); cross-attention is never windowed
    window: int | None = None
    global_every: int = 0  # with a window: 0 = every layer local; n >= 2: n, 2n, ... global
    layers: list[str] = field(default_factory=list)  # or per layer: global / local, repeated
    scale: float | None = None  # score scale; null = 1/sqrt(d_head) (T5: 1.0)
    dropout: float = 0.0  # on the attention probabilities (self- and cross-attention)
    # attention patterns (docs/mixers.md "Attention patterns"; the rules: masks.py)
    sinks: int = 0  # local layers: the first n real tokens of each document stay visible
    learned_sink: bool = False  # a learned per-head sink logit (every softmax self-attention)
    # local layers attend within chunks of this many tokens of their document (Llama 4's
    # attention_chunk_size), instead of a window; global_every / layers say which are global
    attention_chunk: int | None = None
    # local layers: the first n real tokens of each document see and are seen by every token
    # of it (Longformer's global attention; causal: their past only)
    global_tokens: int = 0
    # local layers: each query block of block_size tokens of a document also sees this many
    # key blocks of it drawn from pattern_seed and the layer (BigBird; causal: earlier ones)
    # local layers: every token of this id is global too (Longformer's marked tokens: a CLS or
    # question token), as global_tokens are
    global_token_id: int | None = None
    random_blocks: int = 0
    block_size: int = 16
    pattern_seed: int = 0
    global_rope: bool = True  # false: the global layers of a local stack rotate nothing
    global_temperature: float = 0.0  # Llama 4's attn_scale on those no-rotary global layers
    temperature_floor: int = 8192  # Llama 4's floor_scale
    # Transformer-XL memory of the global layers in a carry cache (memory.py): the inputs of
    # the last n real tokens, detached (0 = none: each segment alone; null = the whole
    # document, with its graph: data.segment_mode=split)
    mem_len: int | None = 0
    eval_mem_len: int | None = None  # the memory of an evaluation carry (null = mem_len)
    # compressed memory (compress.py): what the memory evicts, compressed at this ratio (0 =
    # dropped) into compress_len slots (null = mem_len // ratio) by mean pooling or a conv,
    # trained by the attention-reconstruction loss of this weight
    compress_ratio: int = 0
    compress_len: int | None = None
    compress_kind: str = "conv"
    compress_loss: float = 1.0
    # stability (docs/mixers.md "Stability knobs"): a norm of the "norm" registry (model.norm's
    # eps and bias) on q and k before rotary, per head (Qwen3) or over all heads (OLMo-2)
    qk_norm: str | None = None
    qk_norm_scope: str = "head"
    softcap: float | None = None  # scores <- c·tanh(scores / c) before the mask (Gemma 2: 50)


def softmax_options(m: ModelConfig) -> SoftmaxOptions:
    return m.mixer.read(SoftmaxOptions)


def summary_rows(opts: SoftmaxOptions) -> list[tuple[str, str]]:
    """What the estimator's table shows for these options (``SoftmaxAttention.summary_rows``)."""
    rows = [("attention sink", "learned logit per head")] if opts.learned_sink else []
    rows += stability_rows(opts)
    if opts.mem_len != 0:  # Transformer-XL memory of the global layers (memory.py)
        ev = "" if opts.eval_mem_len is None else f", {opts.eval_mem_len} at evaluation"
        rows.append(("XL memory", "the whole document" if opts.mem_len is None else
                     f"last {opts.mem_len} tokens' layer inputs{ev}"))
    if opts.compress_ratio and opts.mem_len:
        rows.append(("compressed memory", f"ratio {opts.compress_ratio} ({opts.compress_kind}"
                     f"), loss weight {opts.compress_loss}"))
    if opts.window is None and opts.attention_chunk is None:
        return rows
    g, kinds = opts.global_every, opts.layers
    pattern = "every softmax layer local" if not g else f"layers {g}, {2 * g}, ... global"
    if kinds:  # an explicit pattern, repeated over the layers
        pattern = f"per layer: {', '.join(kinds)}"
    if opts.attention_chunk is not None:
        rows.append(("attention chunk", f"{opts.attention_chunk} tokens ({pattern})"))
    else:
        rows.append(("attention window", f"{opts.window} tokens ({pattern})"))
    if opts.sinks:
        rows.append(("attention sinks", f"first {opts.sinks} tokens of each document"))
    if opts.global_tokens:
        rows.append(("global tokens", f"first {opts.global_tokens} tokens of each document"))
    if opts.global_token_id is not None:
        rows.append(("marked global tokens", f"every token of id {opts.global_token_id}"))
    if opts.random_blocks:
        rows.append(("random blocks", f"{opts.random_blocks} of {opts.block_size} tokens "
                     f"per query block (seed {opts.pattern_seed})"))
    if not opts.global_rope:
        t = opts.global_temperature
        rows.append(("global layers", "no rotary angles" + (
            f", temperature {t} per {opts.temperature_floor} tokens" if t else "")))
    return rows


def stability_rows(opts: SoftmaxOptions) -> list[tuple[str, str]]:
    """The estimator's rows of QK-norm and the attention softcap (absent when off)."""
    rows = []
    if opts.qk_norm is not None:
        scope = "per head" if opts.qk_norm_scope == "head" else "over all heads"
        rows.append(("QK-norm", f"{opts.qk_norm} on q and k, {scope}"))
    if opts.softcap is not None:
        rows.append(("attention softcap", f"c·tanh(s/c), c = {opts.softcap:g}"))
    return rows


def _stability(opts: SoftmaxOptions) -> str:
    """``describe``'s suffix of QK-norm and the softcap, e.g. ``, qk-norm rmsnorm/head``."""
    out = "" if opts.qk_norm is None else f", qk-norm {opts.qk_norm}/{opts.qk_norm_scope}"
    return out + ("" if opts.softcap is None else f", softcap {opts.softcap:g}")


def describe(m: ModelConfig, layer: int) -> str:
    """``SoftmaxAttention.describe``: what layer ``layer`` sees, e.g. ``(global, memory 64
    (+16 compressed))``, ``(local, window 128, 4 sinks)``."""
    from blocklab.model import masks

    opts = softmax_options(m)
    pattern = masks.layer_pattern(opts, layer)
    sink = (", learned sink" if opts.learned_sink else "") + _stability(opts)
    if pattern is None:
        nope = not opts.global_rope and (opts.window or opts.attention_chunk)
        c = _compressed(m, layer)[1]
        memory = ", memory: the whole document" if opts.mem_len is None else ""
        if opts.mem_len:
            memory = f", memory {opts.mem_len}" + (f" (+{c} compressed)" if c else "")
        return f"(global{', no rotary' if nope else ''}{memory}{sink})"
    window, _, chunk = masks.unpack(pattern)
    what = f"chunked, chunk {chunk}" if chunk is not None else f"local, window {window}"
    if isinstance(pattern, masks.Pattern) and pattern.sinks:
        what += f", {pattern.sinks} sinks"
    if isinstance(pattern, masks.Pattern) and pattern.global_tokens:
        what += f", {pattern.global_tokens} global tokens"
    if isinstance(pattern, masks.Pattern) and pattern.random_blocks:
        what += f", {pattern.random_blocks} random blocks of {pattern.block_size}"
    if isinstance(pattern, masks.Pattern) and pattern.marked:
        what += f", token {opts.global_token_id} global"
    return f"({what}{sink})"


def _memory(m: ModelConfig, layer: int) -> int:
    """Memory slots a global layer keeps in a training carry (0: none, or the whole document
    when ``mem_len`` is null, priced as keeping every key); 0 for a local layer."""
    from blocklab.model import masks

    opts = softmax_options(m)
    return (opts.mem_len or 0) if masks.layer_pattern(opts, layer) is None else 0


def _compressed(m: ModelConfig, layer: int) -> tuple[int, int]:
    """``(ratio, slots)`` of a global layer's compressed memory; (0, 0) without one."""
    opts = softmax_options(m)
    if not (_memory(m, layer) and opts.compress_ratio):
        return 0, 0
    n = opts.compress_len
    return opts.compress_ratio, n if n is not None else max(1, opts.mem_len // opts.compress_ratio)


def extra_params(m: ModelConfig, layer: int) -> int:
    """A global layer's learned compressor: ``Conv1d(d, d, ratio)`` (``d²·ratio + d``)."""
    ratio, _ = _compressed(m, layer)
    conv = ratio and softmax_options(m).compress_kind == "conv"
    return m.d_model * m.d_model * ratio + m.d_model if conv else 0


def score_keys(m: ModelConfig, layer: int, *, seq_len: int) -> int:
    """``SoftmaxAttention.score_keys``: ``T`` (a global layer; the full-context convention of
    "PaLM", arXiv 2204.02311), ``T + mem_len`` with XL memory (memory.py), ``min(window + n,
    T)`` (a local one: the blocked computation never scores far keys; ``n`` = sinks or global
    tokens, whichever is more) or ``min(chunk + n, T)`` (a chunked one). An encoder's global
    tokens also score every key (``g · T`` pairs per row, counted as ``2 n``); random blocks
    ``r · s`` more; marked tokens (the data's) are not counted."""
    from blocklab.model import masks

    pattern = masks.layer_pattern(softmax_options(m), layer)
    if pattern is None:
        return seq_len + _memory(m, layer) + _compressed(m, layer)[1]
    window, kept, chunk = masks.unpack(pattern)
    if isinstance(pattern, masks.Pattern):  # global queries; r random blocks of s tokens
        kept += pattern.global_tokens + pattern.random_blocks * pattern.block_size
    return min((chunk if chunk is not None else window) + kept, seq_len)  # type: ignore


def memory_flops(m: ModelConfig, layer: int, *, seq_len: int) -> float:
    """FLOPs per token of recomputing an XL memory's projections each segment of ``T =
    seq_len`` tokens: the one ``qkv`` call of [memory; segment] projects the ``M`` memory rows
    too, ``2 · (H + 2·Hkv) · D · d · M / T``."""
    rows = (m.n_heads + 2 * m.kv_heads) * m.head_dim
    kept = _memory(m, layer) + _compressed(m, layer)[1]
    # a conv compressor runs once per ratio evicted tokens (about one per segment token), not
    # per token as 2 x its parameters (counted by the caller) would say: 2 d^2 per token
    conv = extra_params(m, layer)
    fix = 2.0 * m.d_model * m.d_model - 2.0 * conv if conv else 0.0
    return 2.0 * rows * m.d_model * kept / seq_len + fix


def state_bytes(m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                bytes_per_value: int) -> int:
    """``SoftmaxAttention.state_bytes``: K and V of every token so far, or of what a local
    layer's ring keeps — the ``min(window - 1, T)`` (``min(chunk - 1, T)``) last tokens and
    ``min(sinks, T)`` sinks, constant past that: ``2 · B · H_kv · d_head · bytes`` per token.
    A global layer with XL memory carries its inputs instead: ``B · mem_len · d · bytes``."""
    from blocklab.model import masks
    from blocklab.model.kv import ring_slots, sink_slots

    if _memory(m, layer):
        kept = _memory(m, layer) + _compressed(m, layer)[1]
        return batch * kept * m.d_model * bytes_per_value
    pattern = masks.layer_pattern(softmax_options(m), layer)
    whole = pattern is None or getattr(pattern, "random_blocks", 0)  # every token so far
    marks = batch * seq_len if getattr(pattern, "marked", False) else 0  # bool per token
    tokens = seq_len if whole or marks else (
        ring_slots(pattern, seq_len) + sink_slots(pattern, seq_len))
    return 2 * batch * tokens * m.kv_heads * m.head_dim * bytes_per_value + marks


def check_values(opts: SoftmaxOptions, key: str) -> None:
    """The values of softmax's options, whenever they are in use (cross-attention too)."""
    require(opts.scale is None or (finite(opts.scale) and opts.scale > 0),
            f"{key}.scale", opts.scale, "must be null (1/sqrt(d_head)) or a finite number > 0")
    require(finite(opts.dropout) and 0.0 <= opts.dropout < 1.0, f"{key}.dropout",
            opts.dropout, "must be in [0, 1)")
    for name in ("mem_len", "eval_mem_len"):
        n = getattr(opts, name)
        require(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0),
                f"{key}.{name}", n, "must be null or an integer >= 0 (tokens of XL memory)")
    check_compression(opts, key)
    check_stability(opts, key)
    w, every, kinds = opts.window, opts.global_every, opts.layers
    require(w is None or (isinstance(w, int) and w >= 1), f"{key}.window", w,
            "must be null (global attention) or >= 1 (keys per query, the query included)")
    check_patterns(opts, key)
    local = w is not None or opts.attention_chunk is not None
    require(every == 0 or every >= 2, f"{key}.global_every", every,
            "must be 0 (every layer local) or >= 2 (layers n, 2n, ... global)")
    require(every == 0 or local, f"{key}.global_every", every,
            f"needs {key}.window or {key}.attention_chunk (null: every layer is already "
            "global)")
    if not kinds:
        return
    bad = [x for x in kinds if x not in LAYER_KINDS]
    require(not bad, f"{key}.layers", kinds, f"entries must be one of "
            f"{', '.join(LAYER_KINDS)} (not {bad[0]!r})" if bad else "")
    require(local, f"{key}.layers", kinds, f"needs {key}.window or {key}.attention_chunk "
            "(null: every layer is already global)")
    require(every == 0, f"{key}.layers", kinds, f"says which layers are global, and so "
            f"does {key}.global_every={every}", "set global_every: 0 with an explicit list")
    require("local" in kinds, f"{key}.layers", kinds, "no layer would be local, so the "
            "window would change nothing", "window: null makes every layer global")


def check_compression(opts: SoftmaxOptions, key: str) -> None:
    """The compressed memory's options (compress.py), each refused in one line."""
    r = opts.compress_ratio
    require(isinstance(r, int) and (r == 0 or r >= 2), f"{key}.compress_ratio", r,
            "must be 0 (evicted memory dropped) or >= 2 (tokens per compressed slot)")
    require(r == 0 or bool(opts.mem_len), f"{key}.compress_ratio", r,
            f"compresses evicted memory: set {key}.mem_len > 0")
    n = opts.compress_len
    require(n is None or (isinstance(n, int) and n >= 1), f"{key}.compress_len", n,
            "must be null (mem_len // compress_ratio) or >= 1")
    require(opts.compress_kind in ("mean", "conv"), f"{key}.compress_kind", opts.compress_kind,
            "one of mean, conv")
    require(finite(opts.compress_loss) and opts.compress_loss >= 0, f"{key}.compress_loss",
            opts.compress_loss, "must be >= 0")


def check_stability(opts: SoftmaxOptions, key: str) -> None:
    """QK-norm (a kind of the "norm" registry, a scope) and the softcap (null or > 0)."""
    from blocklab.registry import names

    kinds = names("norm")
    require(opts.qk_norm is None or opts.qk_norm in kinds, f"{key}.qk_norm", opts.qk_norm,
            f"must be null (none) or a norm kind: {', '.join(kinds)}")
    require(opts.qk_norm_scope in QK_NORM_SCOPES, f"{key}.qk_norm_scope", opts.qk_norm_scope,
            f"must be one of {', '.join(QK_NORM_SCOPES)} (one norm of width d_head shared by "
            "the heads, or one over all heads)")
    c = opts.softcap
    require(c is None or (finite(c) and c > 0), f"{key}.softcap", c,
            "must be null (no softcap) or a finite number > 0")


def check_patterns(opts: SoftmaxOptions, key: str) -> None:
    """The attention patterns' values (sinks, chunks, the global layers' rotary and
    temperature), each refused in one line."""
    w, chunk, n = opts.window, opts.attention_chunk, opts.sinks
    require(chunk is None or (isinstance(chunk, int) and chunk >= 1), f"{key}.attention_chunk",
            chunk, "must be null (no chunks) or >= 1 (tokens per chunk of a document)")
    require(chunk is None or w is None, f"{key}.attention_chunk", chunk,
            f"and {key}.window={w} both say what a local layer sees: set one of them")
    require(isinstance(n, int) and n >= 0, f"{key}.sinks", n,
            "must be an integer >= 0 (first tokens of each document kept visible)")
    require(n == 0 or w is not None or chunk is not None, f"{key}.sinks", n,
            f"needs {key}.window or {key}.attention_chunk: a global layer already sees "
            "every earlier token")
    g = opts.global_tokens
    require(isinstance(g, int) and g >= 0, f"{key}.global_tokens", g,
            "must be an integer >= 0 (first tokens of each document made global)")
    require(g == 0 or w is not None or chunk is not None, f"{key}.global_tokens", g,
            f"needs {key}.window or {key}.attention_chunk: a global layer already sees "
            "every token")
    local = w is not None or chunk is not None
    tid = opts.global_token_id
    require(tid is None or (isinstance(tid, int) and tid >= 0), f"{key}.global_token_id", tid,
            "must be null (no marked tokens) or a token id >= 0")
    require(tid is None or local, f"{key}.global_token_id", tid, f"needs {key}.window or "
            f"{key}.attention_chunk: a global layer already sees every token")
    r, s = opts.random_blocks, opts.block_size
    require(isinstance(r, int) and r >= 0, f"{key}.random_blocks", r,
            "must be an integer >= 0 (random key blocks per query block)")
    require(r == 0 or local, f"{key}.random_blocks", r, f"needs {key}.window or "
            f"{key}.attention_chunk: a global layer already sees every block")
    require(isinstance(s, int) and s >= 1, f"{key}.block_size", s,
            "must be an integer >= 1 (tokens per random block)")
    require(isinstance(opts.pattern_seed, int), f"{key}.pattern_seed", opts.pattern_seed,
            "must be an integer (the seed of the random blocks' draw)")
    require(opts.global_rope or local, f"{key}.global_rope", opts.global_rope,
            f"false needs {key}.window or {key}.attention_chunk (the global layers of a "
            "local stack drop rotary angles)")
    t = opts.global_temperature
    require(finite(t) and t >= 0, f"{key}.global_temperature", t, "must be finite and >= 0")
    require(t == 0 or not opts.global_rope, f"{key}.global_temperature", t,
            f"tunes the no-rotary global layers only: needs {key}.global_rope=false")
    f = opts.temperature_floor
    require(isinstance(f, int) and f >= 1, f"{key}.temperature_floor", f,
            "must be an integer >= 1 (tokens per temperature step)")


def check_window(m: ModelConfig, opts: SoftmaxOptions, *, causal: bool, key: str) -> None:
    """The window against the stacks: odd in a bidirectional stack (a centred window), and
    a pattern that leaves a layer global and no entry unread."""
    from blocklab.registry import lookup

    tid = opts.global_token_id
    require(tid is None or tid < m.vocab_size, f"{key}.global_token_id", tid,
            f"must be a token id < model.vocab_size={m.vocab_size}")
    w = opts.window
    require(w is None or causal or w % 2 == 1, f"{key}.window", w,
            f"must be odd for family {m.family.name!r}: a bidirectional stack sees "
            "(window - 1) / 2 tokens on each side")
    rotary = lookup("position", m.position.name).has_rotary()
    require(opts.global_rope or rotary, f"{key}.global_rope",
            opts.global_rope, f"false drops rotary angles, but model.position.name="
            f"{m.position.name!r} has none", "use model/position=rope or global_rope: true")
    if w is None and opts.attention_chunk is None:
        return
    stacks = lookup("family", m.family.name).stacks(m)
    deepest = max(n for n, _, _ in stacks)  # a shallower stack may be all local
    depths = (f"model.n_layers={m.n_layers}" if m.family.n_encoder_layers is None else
              f"model.n_layers={m.n_layers}, model.family.n_encoder_layers="
              f"{m.encoder_layers}")
    require(opts.global_every <= deepest, f"{key}.global_every", opts.global_every,
            f"no layer would be global: must be <= the deepest stack's {deepest} layers "
            f"({depths})", "global_every: 0 makes every layer local")
    require(len(opts.layers) <= deepest, f"{key}.layers", opts.layers,
            f"{len(opts.layers)} entries, more than the deepest stack's {deepest} layers "
            f"({depths}): the rest would never be read")
