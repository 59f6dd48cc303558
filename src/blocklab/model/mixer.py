"""The sequence-mixer seam: what a layer's mixer receives, and what it owes.

A *sequence mixer* is the part of a block that moves information along the sequence: softmax
attention (attention.py), linear attention (linear.py), gated convolutions (conv.py), selective
state spaces (ssm.py), or a user's own (``register("mixer", name)``). Every layer has one
(``model.mixer.name``, or ``model.mixer.pattern`` for hybrid stacks); cross-attention of an
encoder–decoder stays softmax attention and is not a mixer.

A stack hands each mixer the *facts* of the sequence, :class:`Sequence` — positions, which
tokens are real (``valid``), packed documents (``segments``), causal or bidirectional, the
rotary angles, the decode cache's shared bookkeeping — never a prebuilt mask. A score-based
mixer asks ``seq.visibility(window)`` (decoding: ``seq.visibility(window, keys)``); masks.py
alone decides what it holds, and the answer is memoised per forward, so every softmax layer of a stack shares one mask. Padding and packed
documents therefore reach every mixer as data, and invariance to them (a padded row equals
the row alone; documents never mix) is each mixer's own obligation — the variant grid tests it.

The contract (:class:`Mixer`):

- ``Mixer(m: ModelConfig, layer: int, *, causal: bool)`` builds layer ``layer`` of a causal
  or bidirectional stack; it reads its options with ``m.mixer.read(Options)`` and the shared
  head layout (MHA / GQA / MQA, ``n_kv_heads``, ``bias``) from ``m.attention``;
- ``options``: the mixer's options dataclass, defined beside it (``SoftmaxOptions`` in
  attention.py, ``LinearOptions``, ``ConvOptions``, ``SSMOptions``); None for a plugin mixer
  that reads the free-form ``model.mixer.options`` dict instead;
- ``forward(x, seq, state) -> y``: (B, T, d) -> (B, T, d); ``state`` is this layer's decode
  state (None without a cache);
- ``new_state(batch, capacity, *, dtype, device, static) -> State | None``: the decode state of
  this layer (a K/V buffer, a window ring, a recurrent matrix, a convolution tail ...);
  ``static=True`` asks for fixed shapes and in-place updates (compiled decoding);
- class methods for the estimator and the validator, all without building the mixer:
  ``param_count(m, layer, *, causal)``, ``flops_per_token(m, layer, *, seq_len, causal)``
  (forward FLOPs per token of the whole mixer at a context of ``seq_len``),
  ``state_bytes(m, layer, *, batch, seq_len, bytes_per_value)`` (its decode state after
  ``seq_len`` tokens), ``check(m, layer, *, causal, key)`` (its own config rules for one
  layer; raise a one-line ConfigError) and, optionally, ``check_options(opts, key)`` (rules
  on its option values alone, asked once whenever its options are in use);
- ``cross_options``: the options cross-attention reads from this mixer's (softmax: ``scale``
  and ``dropout`` -- cross-attention is softmax attention), in use whenever a stack has
  cross-attention;
- attributes ``bidirectional`` (it has a form for encoder stacks), ``uses_score_bias`` (it
  applies the position scheme's score bias: ALiBi, T5) and ``uses_rotary`` (it rotates by the
  rotary scheme's angles); a position scheme no layer uses is refused by the validator;
  ``residual_outputs`` (the names of its submodules whose weights write into the residual
  stream — its output projections — whose init the model scales by 1/sqrt(2·layers); nothing
  is guessed from parameter names, and a mixer that declares none gets plain init, warned).

**Options.** Each mixer owns its options (config/mixer_options.py). On the command line they
stay flat, ``model.mixer.<option>`` (``model.mixer.window=64``, ``model.mixer.d_state=8``), as
in users' command lines and recorded overrides. ``model.mixer`` is therefore an open node of
the Hydra schema (a :class:`~blocklab.config.MixerConfig`, a dict, in Python:
``MixerConfig(name="ssm", d_state=8)``), and each ``configs/model/mixer/<name>.yaml`` lists
its own options with their defaults, so ``--cfg job`` shows exactly the options of the chosen
mixer. An option the chosen file does not list (another mixer's, or one of a second mixer of a
hybrid ``pattern`` / ``encoder``) needs ``+model.mixer.<option>=``; without the ``+`` the
one-line compose error names the mixer that owns it (or the closest key). Validation then
reads every key into the options dataclass of each mixer in use (one value for a name two of
them declare: ``chunk``), refuses any other key naming its owner or the closest key, types the
values and fills in the defaults. Why not one typed dataclass per mixer nested under
``model.mixer.<name>``: the flat keys are in users' command lines and in the overrides recorded by
earlier runs, and a per-mixer node would make hybrids repeat a shared option. Why not the union of
every mixer's options (the old schema): an option of another mixer was silently accepted and
ignored, and a plugin could not add flat options.

A :class:`State` holds tensors whose dim 0 is the batch: ``select(rows)`` (shared-prefix
scoring copies rows), ``reset()`` (in place) and ``nbytes`` work on them generically. What a
state may read: only what its mixer passes it — the forward's
:class:`~blocklab.model.cache.Step` (``seq.cache.step``: positions, real tokens, token orders,
real tokens per row before and after, the slots written), the compacted rows of seqops.py, a
shared book — never an attribute of the cache that holds it. It writes its tensors only
through :meth:`Rows.put` / :meth:`Rows.writable`: in place while decoding, functionally in a
*carry* cache (state carried across training segments with autograd on, model/carry.py;
docs/extending.md, "the carry contract"), which also detaches, empties rows of and saves
states generically. The cache itself
(:class:`~blocklab.model.cache.DecodeCache`) keeps only the token bookkeeping every layer
shares and one state per layer (plus cross-attention's, :class:`~blocklab.model.kv.CrossKV`).

Where keys live: a score-based mixer keeps its keys in its own state and tells
``seq.visibility(window, keys, share=...)`` where they are (:class:`Keys`: their positions,
validity and token orders). Softmax attention's *key books* — ``History`` (global layers),
``Ring`` (local layers), ``Fixed`` (compiled decoding), each shared by every softmax layer
with that buffer — are in kv.py with its K/V states; a state asks for a book by naming it in
``State.books`` (key -> constructor), and the cache makes and updates each book once per
forward without knowing its kind. So a score-based mixer with its own key layout touches no
shared file (the example plugin's ``compact_kv``). Mechanics several mixers share — real
tokens to the front and back, the short convolution with document restarts and a decode tail
— are in seqops.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from blocklab.config import ModelConfig
from blocklab.model import masks

if TYPE_CHECKING:
    from blocklab.model.cache import Book, DecodeCache
    from blocklab.model.position import Position


@dataclass(frozen=True)
class Keys:
    """The keys a score-based layer attends over in one decoding forward (its cached keys
    and the new tokens, in the layout of its own state), for :meth:`Sequence.visibility`."""

    positions: Tensor  # (B, Tk)
    valid: Tensor | None  # (B, Tk) bool; None = no padding
    order: Tensor | None = None  # (B, Tk): set, causality (and windows) go by token order
    q_order: Tensor | None = None  # (B, T) the new tokens' orders (with ``order``)
    marked: Tensor | None = None  # (B, Tk) bool: keys marked global (``global_token_id``)
    segments: Tensor | None = None  # (B, Tk) document ids of the keys (a carry cache's)


@dataclass
class Sequence:
    """The facts of one stack forward, shared by every layer's mixer."""

    positions: Tensor  # (B, T) position ids
    valid: Tensor | None  # (B, T) bool, real tokens; None = no padding
    segments: Tensor | None  # (B, T) packed documents; None = one per row
    causal: bool
    position: Position  # the stack's position scheme (score biases)
    rotary: tuple[Tensor, Tensor] | None = None  # (cos, sin) of the rotary scheme
    cache: DecodeCache | None = None  # decoding: shared token bookkeeping + layer states
    marked: Tensor | None = None  # (B, T) bool: tokens of softmax's global_token_id
    #: a carry cache's forward: each row's first document continues the carried state
    carried: bool = False
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    def real(self) -> Tensor:
        """(B, T) bool: the real tokens (all True without padding)."""
        if self.valid is None:
            return torch.ones_like(self.positions, dtype=torch.bool)
        return self.valid.bool()

    def starts(self) -> Tensor | None:
        """(B, T) bool: tokens that begin a packed document (a recurrent state restarts
        there), or None without packing. Padding never starts one."""
        if self.segments is None:
            return None
        return self.memo("starts", self._starts)

    def _starts(self) -> Tensor:
        starts = masks.document_starts(self.segments, self.valid)
        if self.carried:  # the first document continues the state (or it was reset: zeros)
            starts = starts & (starts.long().cumsum(-1) > 1)
        return starts

    def visibility(self, window: int | None = None, keys: Keys | None = None, *,
                   share: Hashable | None = None) -> masks.Visibility:
        """Which keys each query may see, for a score-based mixer with this ``window``
        (None = global). Without a cache: over this forward's tokens, built once per window
        and forward. Decoding: over ``keys``, the keys the mixer attends over (its cached
        keys and these tokens, as its own state lays them out); built once per window and
        ``share`` (say which layers share those keys; None: not shared)."""
        if keys is None:
            if self.cache is not None:
                raise ValueError("decoding: Sequence.visibility needs the keys the mixer "
                                 "attends over (keys=)")
            return self.memo(("visibility", window), lambda: self._visibility(window, None))
        if share is None:
            return self._visibility(window, keys)
        return self.memo(("visibility", window, share),
                         lambda: self._visibility(window, keys))

    def _visibility(self, window: int | None, keys: Keys | None) -> masks.Visibility:
        t = self.length
        common = {"causal": self.causal, "q_len": t, "device": self.positions.device}
        if keys is None:
            return masks.self_visibility(
                **common, k_len=t, key_valid=self.valid, q_segments=self.segments,
                k_segments=self.segments, window=window, q_marked=self.marked,
                k_marked=self.marked,
                bias=self.position.score_bias(self.positions, self.positions))
        return masks.self_visibility(
            **common, k_len=keys.positions.shape[1], key_valid=keys.valid,
            bias=self.position.score_bias(self.positions, keys.positions), window=window,
            q_order=keys.q_order, k_order=keys.order, q_marked=self.marked,
            k_marked=keys.marked, **({} if keys.segments is None else {  # a carry forward's:
                "q_segments": self.segments, "k_segments": keys.segments,  # positions count
                "q_doc": self.positions, "k_doc": keys.positions}))  # a document's tokens

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, built once per forward under ``key`` and shared by every layer (the
        visibility, seqops' compacted rows; a user's mixer may keep its own here)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


class Rows:
    """Named per-row tensors (dim 0 = rows) and how they are written, copied, reset and saved:
    the base of :class:`State` and of the cache's books. Attributes named in ``transient``
    hold what one forward computed and are neither copied nor saved.

    **Writes.** Decoding writes in place (the same buffers at every step: compiled decoding).
    A carry cache (``Model.new_cache(batch, None, carry=True)``: state carried across training
    segments, autograd on) sets ``functional``: every write then rebinds a new tensor instead,
    so autograd sees each version. A state writes only through :meth:`put` (a whole tensor)
    and :meth:`writable` (a tensor about to take index writes: a clone, rebound, when
    functional)."""

    transient: tuple[str, ...] = ()
    #: writes rebind new tensors (a carry cache: autograd-safe) instead of copying in place
    functional: bool = False

    def tensors(self) -> dict[str, Tensor]:
        return {k: v for k, v in vars(self).items()
                if isinstance(v, Tensor) and k not in self.transient}

    def put(self, name: str, value: Tensor) -> None:
        """Set tensor ``name`` to ``value``: rebound when functional, copied in place else."""
        if self.functional:
            setattr(self, name, value)
        else:
            getattr(self, name).copy_(value)

    def writable(self, name: str) -> Tensor:
        """Tensor ``name``, ready for index writes: itself (in place), or when functional a
        clone rebound under the name (earlier readers keep the version they read)."""
        t = getattr(self, name)
        if self.functional:
            t = t.clone()
            setattr(self, name, t)
        return t

    def detach(self) -> None:
        """Cut autograd's graph at the current values (truncated backpropagation)."""
        for name, t in self.tensors().items():
            setattr(self, name, t.detach())

    def reset_rows(self, rows: Tensor) -> None:
        """Rows ``rows`` ((B,) bool) emptied (zeroed), the others kept: functionally."""
        for name, t in self.tensors().items():
            keep = (~rows).view(-1, *(1,) * (t.dim() - 1))
            setattr(self, name, torch.where(keep, t, torch.zeros((), dtype=t.dtype,
                                                                  device=t.device)))

    def state_dict(self) -> dict[str, Any]:
        """The tensors and plain values (ints, floats, bools) that make up the rows."""
        return {k: v for k, v in vars(self).items() if k not in self.transient
                and k != "functional" and isinstance(v, (Tensor, bool, int, float))}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        for k, v in sd.items():
            old = getattr(self, k, None)
            if isinstance(v, Tensor) and isinstance(old, Tensor):
                v = v.to(device=old.device, dtype=old.dtype)
            setattr(self, k, v)


class State(Rows):
    """A layer's decode state: named tensors whose dim 0 is the batch (rows), updated in
    place by its mixer (or functionally in a carry cache: :class:`Rows`). Subclasses add the
    logic. A state reads only what its mixer passes it (the forward's ``Step``, a book), never
    the cache that holds it. ``books``: the shared bookkeeping it relies on, key ->
    constructor ``(batch, capacity, device) -> Book`` (cache.py makes each key once per cache;
    softmax's key books: kv.py); none by default."""

    books: Mapping[Hashable, Callable[..., Book]] = MappingProxyType({})

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors().values())

    def select(self, rows: Tensor) -> State:
        """A copy whose row ``j`` is row ``rows[j]`` of this state."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, t in self.tensors().items():
            setattr(new, name, t.index_select(0, rows))
        return new

    def reset(self) -> None:
        for t in self.tensors().values():
            t.zero_()

    def static_tensors(self) -> list[Tensor]:
        """Buffers a compiled step reads and writes in place (marked static for CUDA
        graphs)."""
        return list(self.tensors().values())


class Mixer(nn.Module):
    """Base of every sequence mixer (see the module docstring for the contract)."""

    #: whether the mixer has a bidirectional form (encoder stacks)
    bidirectional: bool = True
    #: whether the mixer applies the position scheme's score bias (ALiBi, T5 buckets)
    uses_score_bias: bool = False
    #: whether the mixer rotates by the rotary scheme's angles (RoPE)
    uses_rotary: bool = False
    #: its submodules whose weights write into the residual stream (output projections): their
    #: init is scaled by 1/sqrt(2·layers). None = not declared (plain init, with a warning)
    residual_outputs: tuple[str, ...] | None = None
    #: the options dataclass (``model.mixer.<option>``); None: reads ``model.mixer.options``
    options: type | None = None
    #: the options cross-attention reads from this mixer's (softmax's scale and dropout)
    cross_options: tuple[str, ...] = ()

    def __init__(self, m: ModelConfig, layer: int, *, causal: bool) -> None:
        super().__init__()
        self.layer, self.causal = layer, causal

    def forward(self, x: Tensor, seq: Sequence, state: State | None) -> Tensor:
        raise NotImplementedError

    def new_state(self, batch: int, capacity: int, *, dtype: torch.dtype,
                  device: torch.device | str, static: bool = False) -> State | None:
        """This layer's decode state; None for a mixer that keeps none."""
        return None

    @classmethod
    def param_count(cls, m: ModelConfig, layer: int, *, causal: bool) -> int:
        """Parameters of the mixer; by default counted on a copy built on the meta device
        (no memory, no compute) — a mixer with a closed form overrides it."""
        with torch.device("meta"):
            module = cls(m, layer, causal=causal)
        return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())

    @classmethod
    def flops_per_token(cls, m: ModelConfig, layer: int, *, seq_len: int,
                        causal: bool) -> float:
        """Forward FLOPs per token; by default twice the parameters (every parameter one
        multiply-add per token), which a mixer that mixes beyond its weights overrides."""
        return 2.0 * cls.param_count(m, layer, causal=causal)

    @classmethod
    def state_bytes(cls, m: ModelConfig, layer: int, *, batch: int, seq_len: int,
                    bytes_per_value: int) -> int:
        return 0

    @classmethod
    def score_keys(cls, m: ModelConfig, layer: int, *, seq_len: int) -> int:
        """Keys a query scores (a T×T-like score tensor's width: softmax attention's), for
        the activation estimate; 0 for a mixer without scores."""
        return 0

    @classmethod
    def check(cls, m: ModelConfig, layer: int, *, causal: bool, key: str) -> None:
        """The mixer's own config rules for layer ``layer`` (raise a one-line ConfigError)."""

    @classmethod
    def describe(cls, m: ModelConfig, layer: int) -> str:
        """What the estimator adds to the mixer's name for layer ``layer`` (softmax: ``(local,
        window 16)``); empty by default."""
        return ""

    @classmethod
    def growing_carry(cls, m: ModelConfig) -> str | None:
        """The option (``"model.mixer.<key>=<value>"``) that makes this mixer's carried state
        grow with the document (it keeps every token: ``data.segment_mode=stream``, whose
        documents never end, refuses it); None when the state is bounded (the default)."""
        return None

    @classmethod
    def summary_rows(cls, m: ModelConfig) -> list[tuple[str, str]]:
        """Rows the estimator's table shows for this mixer's options (softmax: its window);
        none by default."""
        return []


def mixer_class(m: ModelConfig, layer: int, causal: bool = True) -> type[Mixer]:
    """The mixer component of 0-based ``layer`` of a causal or bidirectional stack."""
    from blocklab.registry import lookup

    return lookup("mixer", m.layer_mixer(layer, causal), m.mixer_key(causal))
