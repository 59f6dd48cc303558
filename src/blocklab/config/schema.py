"""The config schema: structured dataclasses Hydra composes YAML onto (unknown keys and wrong
types fail at compose time), the choices that are not component names, and the facts of the
synthetic vocabulary the rules need."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------------------------- choices
# Component axes (family, norm, block, position, ffn, attention) are plain strings checked
# against their registries (registry.py), so a user module can add a choice; the file name of
# a config group option = the registry key (a test checks both sets are equal). Choices that
# are not components stay enums.


class RopeScaling(enum.Enum):
    none = "none"
    linear = "linear"
    ntk = "ntk"
    yarn = "yarn"
    llama3 = "llama3"


# Choices that are strings in the schema (Lightning's names, file formats, ...): the validators
# below check them; each tuple is the one list of what blocklab supports.
DATA_FORMATS = ("text", "json", "parquet", "disk")  # readers of data.files (disk: save_to_disk)
DOCUMENT_SPLITS = ("file", "line", "paragraph")  # plain text: what one document is
SOURCE_FINGERPRINTS = ("stat", "content")
LONG_DOCUMENTS = ("split", "truncate")
UTF8_ERRORS = ("replace", "strict")
# Lightning accelerators blocklab runs on ("gpu" = Lightning's alias of the CUDA backend).
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
# Lightning 2.6's precision strings (lightning.fabric.plugins.precision.precision
# _PRECISION_INPUT_STR and its aliases "64", "32", "16", "bf16").
PRECISIONS = ("32-true", "32", "16-mixed", "16", "bf16-mixed", "bf16", "16-true", "bf16-true",
              "64-true", "64", "transformer-engine", "transformer-engine-float16")
# Lightning strategies by name (train/run.py _strategy: "fsdp" and "model_parallel" are
# blocklab's own sharded setups, the rest go to Lightning as is).
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "model_parallel")
WANDB_MODES = ("offline", "online", "disabled")
PROFILERS = ("simple", "advanced", "pytorch")  # Lightning's profilers by name
GRAD_NORMS = ("none", "global", "layer")  # trainer.log_grad_norm
PROBE_SPACES = ("auto", "token", "text")
TEXT_HAYSTACKS = ("essay", "shakespeare")  # built in; anything else is a path to a text file


# -------------------------------------------------------------- synthetic vocabulary facts
# What the synthetic tasks (data/synthetic.py) require of a config, defined here (and imported
# there) so that the validators can check a config without importing the data package.

FILLERS = ("iid", "phrase", "markov")  # haystack kinds of the needle task
MARKOV_MIN_FILLER = 4  # the Markov filler chain gives each filler token 4 distinct successors


def needle_min_length(n_distractors: int) -> int:
    """Shortest needle sequence: BOS, 3 tokens per needle, SEP k v, one filler per distractor."""
    return 3 * (n_distractors + 1) + 4 + n_distractors


def mqar_min_length(pairs: int) -> int:
    """Shortest Zoology-layout MQAR sequence (``data.mqar_pairs``): BOS, the records, one
    ``SEP k v`` per key."""
    return 1 + 5 * pairs


def distinct_pairs(task: str, seq_len: int, max_distractors: int) -> int:
    """Distinct keys (and as many values) that one ``task`` sequence of up to ``seq_len`` tokens
    draws from the synthetic vocabulary (0: the task draws no keys)."""
    if task in ("multihop", "counting"):  # unequal key / value needs: distinct_ids
        return max(distinct_ids(task, seq_len, max_distractors))
    return {"needle": max_distractors + 1, "kv_records": (seq_len - 4) // 3,
            "kv_records_query_aware": (seq_len - 6) // 3,
            "mqar": (seq_len - 1) // 6}.get(task, 0)


# Variable tracking (``multihop``) and aggregation (``counting``) as training tasks: the ranges
# each example draws from (inclusive), restricted per example to what fits its length.
MULTIHOP_HOPS = (1, 4)  # assignments in the queried chain (lookups needed)
MULTIHOP_DISTRACTOR_CHAINS = (1, 2)  # other chains of the same length
COUNTING_CANDIDATES = (2, 4)  # distinct candidate ids
COUNTING_MARGINS = (1, 3)  # winner count - runner-up count
COUNTING_MAX_COUNT = 4  # the runner-up occurs 1..4 times (probes and training alike)
MULTI_NEEDLE_VARIANTS = ("multikey", "multivalue", "multiquery")


def multi_needle_needles(variant: str, keys: int, values: int) -> int:
    """Needles of a multi-needle sequence: ``keys`` (multikey, multiquery) or ``keys × values``
    (multivalue: every key carries ``values`` values, so the queried key is not the only
    repeated one)."""
    return keys * values if variant == "multivalue" else keys


def multi_needle_answer_length(variant: str, values: int, queries: int) -> int:
    """Answer tokens: 1 (multikey), ``values`` (multivalue), ``queries`` (multiquery)."""
    return {"multikey": 1, "multivalue": values, "multiquery": queries}[variant]


def multi_needle_min_length(variant: str, keys: int, values: int, queries: int) -> int:
    """Shortest multi-needle sequence: BOS, 3 tokens per needle, at least one filler token,
    SEP, the queried keys and the answer."""
    n_query = queries if variant == "multiquery" else 1
    return (1 + 3 * multi_needle_needles(variant, keys, values) + 1 + 1 + n_query
            + multi_needle_answer_length(variant, values, queries))


def multihop_min_length(hops: int, distractor_chains: int) -> int:
    """Shortest variable-tracking sequence: BOS, 3 tokens per statement of every chain, at
    least one filler token, ``SEP x_h v``."""
    return 1 + 3 * hops * (distractor_chains + 1) + 1 + 3


def counting_min_length(candidates: int, margin: int,
                        max_count: int = COUNTING_MAX_COUNT) -> int:
    """Shortest aggregation sequence for the largest counts: BOS, ``candidates × max_count +
    margin`` candidate tokens, at least one filler token, ``SEP c``."""
    return 1 + candidates * max_count + margin + 1 + 2


def multihop_choices(length: int) -> list[tuple[int, int]]:
    """(hops, distractor chains) pairs the ``multihop`` training task draws from (uniformly) at
    ``length``: the ranges above, restricted to what fits."""
    return [(h, c) for h in range(MULTIHOP_HOPS[0], MULTIHOP_HOPS[1] + 1)
            for c in range(MULTIHOP_DISTRACTOR_CHAINS[0], MULTIHOP_DISTRACTOR_CHAINS[1] + 1)
            if multihop_min_length(h, c) <= length]


def counting_choices(length: int) -> list[tuple[int, int]]:
    """(candidates, margin) pairs the ``counting`` training task draws from at ``length``."""
    return [(k, m) for k in range(COUNTING_CANDIDATES[0], COUNTING_CANDIDATES[1] + 1)
            for m in range(COUNTING_MARGINS[0], COUNTING_MARGINS[1] + 1)
            if counting_min_length(k, m) <= length]


def distinct_ids(task: str, seq_len: int, max_distractors: int = 0) -> tuple[int, int]:
    """(keys, values): distinct key-range and value-range ids that one ``task`` sequence of up
    to ``seq_len`` tokens draws (variables of ``multihop`` are key-range ids)."""
    if task == "multihop":
        fit = multihop_choices(seq_len)
        return (max((h * (c + 1) for h, c in fit), default=0),
                max((c + 1 for _, c in fit), default=0))
    if task == "counting":
        return 0, max((k for k, _ in counting_choices(seq_len)), default=0)
    n = distinct_pairs(task, seq_len, max_distractors)
    return n, n


# ------------------------------------------------------------------------------------ schema


@dataclass
class FamilyConfig:
    name: str = "decoder"
    # encoder_decoder only: encoder depth (null = model.n_layers).
    n_encoder_layers: int | None = None


@dataclass
class NormConfig:
    name: str = "layernorm"
    eps: float = 1e-5
    bias: bool = True  # LayerNorm only; RMSNorm has no bias


@dataclass
class BlockConfig:
    name: str = "pre"


@dataclass
class PositionConfig:
    name: str = "none"
    # rope
    base: float = 10000.0
    scaling: RopeScaling = RopeScaling.none
    factor: float = 1.0  # context extension factor for linear / ntk / yarn
    original_max_seq_len: int | None = None  # yarn: training context (null = model.max_seq_len)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # llama3: wavelengths longer than original/low_freq_factor are interpolated, shorter than
    # original/high_freq_factor kept, a smooth blend between
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # t5_bias
    num_buckets: int = 32
    max_distance: int = 128


GELU_FORMS = ("none", "tanh")  # torch.nn.functional.gelu(approximate=...)


@dataclass
class FFNConfig:
    name: str = "gelu_mlp"
    bias: bool = True
    # GELU form of gelu_mlp / geglu (and the masked-LM head): "none" = exact erf (BERT),
    # "tanh" = the tanh approximation (GPT-2's gelu_new, T5 v1.1's gated-gelu)
    approximate: str = "none"


@dataclass
class AttentionConfig:
    name: str = "mha"
    n_kv_heads: int | None = None  # mha: null (= n_heads); gqa: required; mqa: null (= 1)
    bias: bool = True
    dropout: float = 0.0
    # attention score scale; null = 1/sqrt(d_head); T5 uses 1.0 (unscaled scores)
    scale: float | None = None
    # Local (sliding-window) self-attention: keys per query, the query itself included
    # (null = global). A causal stack sees the query and the window - 1 tokens before it; a
    # bidirectional (encoder) stack the query and (window - 1) / 2 tokens on each side (window
    # odd). Cross-attention is never windowed.
    window: int | None = None
    # Which layers are local when a window is set: 0 = every layer; n >= 2 = every n-th layer
    # (layers n, 2n, ... counting from 1) is global, the others local.
    global_every: int = 0
    # Or an explicit per-layer pattern, "global" / "local" per layer, repeated over the layers
    # of each stack ([] = global_every decides), e.g. [global, global, local, local] for a
    # Qwen2 whose first two of four layers are full attention. Needs a window and
    # global_every: 0.
    layers: list[str] = field(default_factory=list)


ATTENTION_LAYER_KINDS = ("global", "local")  # the entries of model.attention.layers

MIXER_FEATURE_MAPS = ("elu", "taylor")  # linear attention's feature maps


@dataclass
class MixerConfig:
    """The sequence mixer of every layer: how a layer mixes information along the sequence
    (model/mixers.py ``MIXERS``). ``softmax`` is attention (its heads, window and score scale
    are ``model.attention``); the others keep a decode state of their own. Each built-in mixer
    reads only its own options below; a user mixer reads ``options``."""

    name: str = "softmax"  # softmax | linear | gated_conv | ssm | a registered mixer
    # hybrid stacks: one mixer name per layer, repeated over the layers ([] = `name` on every
    # layer), e.g. [linear, linear, linear, softmax] = every 4th layer softmax
    pattern: list[str] = field(default_factory=list)
    # the mixers of a bidirectional (encoder) stack, repeated over its layers ([] = as above):
    # e.g. an encoder–decoder with softmax in the encoder and ssm in the decoder
    encoder: list[str] = field(default_factory=list)
    # linear attention ("Transformers are RNNs", arXiv 2006.16236; "Based", arXiv 2402.18668):
    # feature map elu (elu(x) + 1, d_head features) | taylor (2nd-order Taylor of exp over a
    # feature_dim projection: 1 + d + d^2 features)
    feature_map: str = "elu"
    feature_dim: int = 16  # taylor: query/key projection width per head
    # linear attention and gated_conv: a short causal depthwise convolution of this many taps
    # on the input (0 = none; gated_conv needs >= 1)
    short_conv: int = 0
    chunk: int = 64  # linear / ssm: chunk length of the chunked parallel form in training
    # gated_conv ("Hungry Hungry Hippos", arXiv 2212.14052; "Hyena", arXiv 2302.10866; Zoology's
    # BaseConv, arXiv 2312.04927): y = (W_g x) * long_conv(short_conv(W_u x)); long_conv true
    # adds a filter over the whole context, computed by FFT
    long_conv: bool = True
    # ssm ("Mamba", arXiv 2312.00752): state size per channel, expansion, conv taps, dt rank
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int | None = None  # null = ceil(d_model / 16)
    # a user mixer's own options (open on purpose: its own check() validates them)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    family: FamilyConfig = field(default_factory=FamilyConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)
    vocab_size: int | None = 256  # null = the tokenizer's size (filled in by training)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_head: int | None = None  # null = d_model // n_heads
    d_ff: int = 256
    max_seq_len: int = 256
    dropout: float = 0.0  # embedding and residual dropout
    tie_embeddings: bool = True
    init_std: float = 0.02
    # norm (model.norm's kind) on each stack's input: token (+ type + absolute position)
    # embeddings, before the first block (BERT's embedding LayerNorm)
    embed_norm: bool = False
    # token-type ("segment A/B") embeddings added to the token embeddings; 0 = none (BERT: 2)
    type_vocab_size: int = 0
    # factor on the final hidden state before the LM head (T5 with a tied head: d_model^-0.5)
    head_scale: float = 1.0

    # Derived values: read these, never recompute them at call sites.
    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return resolve_kv_heads(self)

    def layer_mixer(self, layer: int, causal: bool = True) -> str:
        """The mixer name of 0-based ``layer`` of a causal or bidirectional stack
        (``mixer.encoder`` repeated in a bidirectional stack when set, else ``mixer.pattern``
        repeated, else ``mixer.name``)."""
        pattern = self.mixer.pattern if causal or not self.mixer.encoder else self.mixer.encoder
        return pattern[layer % len(pattern)] if pattern else self.mixer.name

    def mixer_key(self, causal: bool = True) -> str:
        """The config key that chose the mixers of a causal / bidirectional stack."""
        if not causal and self.mixer.encoder:
            return "model.mixer.encoder"
        return "model.mixer.pattern" if self.mixer.pattern else "model.mixer.name"

    @property
    def encoder_layers(self) -> int:
        n = self.family.n_encoder_layers
        return self.n_layers if n is None else n


class DataName(enum.Enum):
    synthetic = "synthetic"
    text = "text"


class TokenizerName(enum.Enum):
    synthetic = "synthetic"  # the synthetic task vocabulary (data.name=synthetic)
    bpe = "bpe"  # byte-level BPE trained on the corpus with `tokenizers`
    byte = "byte"  # raw UTF-8 bytes + specials
    file = "file"  # a saved tokenizer.json (HF `tokenizers` format)
    char = "char"  # one id per character seen in the corpus (nanoGPT's shakespeare_char)


@dataclass
class TokenizerConfig:
    name: TokenizerName = TokenizerName.synthetic
    vocab_size: int = 4096  # bpe: target size including specials
    # file: a tokenizer.json, or a Hugging Face tokenizer directory (tokenizer.json plus
    # special_tokens_map.json / tokenizer_config.json naming its special tokens)
    path: str | None = None
    # bpe: trained on at most this much text (a seeded sample); char: the characters of at
    # most this much text make the vocabulary (others read as <unk>)
    sample_bytes: int = 64_000_000


@dataclass
class TaskWeights:
    """Mixture weight of each synthetic task (data/synthetic.py ``TASKS``); 0 = not used."""

    needle: float = 1.0
    kv_records: float = 0.0
    kv_records_query_aware: float = 0.0
    mqar: float = 0.0
    copy: float = 0.0
    markov_lm: float = 0.0
    multihop: float = 0.0  # variable tracking: chains of assignments, answer the root value
    counting: float = 0.0  # aggregation: the most frequent of several candidate ids


@dataclass
class DataConfig:
    name: DataName = DataName.synthetic
    seed: int = 1234
    batch_size: int = 32
    seq_len: int = 128  # longest training sequence (the row length when packing)
    min_len: int = 32  # synthetic: shortest sequence
    # synthetic: short-to-long stages [[from_step, max_len], ...]; after the last, seq_len
    curriculum: list[list[int]] = field(default_factory=list)
    packing: bool = False  # pack documents into seq_len rows with document masks
    # pad every batch to a multiple of this many tokens (null = to its longest row): with
    # trainer.compile_dynamic=false, one compiled graph per padded width
    pad_to_multiple: int | None = None
    val_batches: int = 8
    num_workers: int = 0
    # synthetic
    n_filler: int = 64
    n_keys: int = 64
    n_values: int = 64
    tasks: TaskWeights = field(default_factory=TaskWeights)  # mixture weights by task
    n_distractors: list[int] = field(default_factory=lambda: [1, 3])  # inclusive range
    # mqar: null = records then every key queried (as many pairs as fit); n = Zoology's layout
    # (n pairs, then n queries spread among filler over the whole length)
    mqar_pairs: int | None = None
    # with mqar_pairs: draw each sequence's pair count uniformly from [mqar_min_pairs,
    # mqar_pairs] (null = always mqar_pairs); easy few-pair sequences bootstrap recall
    mqar_min_pairs: int | None = None
    fillers: list[str] = field(default_factory=lambda: ["iid", "phrase", "markov"])
    # text: sources (prepared once into memory-mapped token shards, data/prepare.py)
    corpus: str | None = None  # built-in corpus name (e.g. shakespeare)
    files: list[str] = field(default_factory=list)  # files, directories or glob patterns
    format: str = "text"  # text | json (JSON lines or a JSON array) | parquet | disk
    text_key: str = "text"  # json / parquet / disk: the text column
    documents: str = "file"  # text format: one document per file | line | paragraph
    hub_dataset: str | None = None  # a Hugging Face hub dataset name (streamed; needs network)
    # the split training reads, of a hub dataset or of a saved DatasetDict (format=disk)
    hub_split: str = "train"
    # validation text of your own: files, directories or glob patterns read like data.files
    # (same format, documents, text_key); every document of them validates, nothing is held out
    val_files: list[str] = field(default_factory=list)
    # the validation split of a saved DatasetDict or a hub dataset: auto = a saved DatasetDict's
    # "validation" split when it has one (a hub dataset's only when named); none = held out
    # (val_fraction); last = the last val_fraction of the tokens, however many documents
    # (nanoGPT's cut); or a split name
    val_split: str = "auto"
    cache_dir: str | None = None  # prepared corpora (null: $BLOCKLAB_DATA_CACHE or outputs/.cache/data)
    num_proc: int | None = None  # preparation processes (null: every core, at most 8)
    fingerprint: str = "stat"  # sources identified by name+size+mtime (stat) or content hash
    # without a validation source (val_files / val_split): whole documents held out by a seeded
    # draw, or the last val_fraction of the corpus's tokens when the corpus has too few
    # documents for that (fewer than 1 / (2 val_fraction): one document, nanoGPT-style)
    val_fraction: float = 0.02
    long_documents: str = "split"  # split | truncate
    utf8_errors: str = "replace"  # replace (and count) | strict (fail naming file and offset)
    mlm_probability: float = 0.15  # encoder family: fraction of tokens masked


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | sgd | lion | adafactor, or a registered one (train/optim.py)
    lr: float = 1e-3
    # on the weights of linear layers only (train/optim.py param_groups), for every optimizer:
    # decoupled for adamw / lion / adafactor, L2 (added to the gradient) for sgd
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # adamw, lion
    eps: float = 1e-8  # adamw
    grad_clip: float = 1.0  # 0 = off
    momentum: float = 0.9  # sgd
    nesterov: bool = False  # sgd


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | constant | linear
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1


@dataclass
class TrainerConfig:
    name: str = "cpu"
    accelerator: str = "cpu"
    devices: int = 1
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    max_steps: int = 1000
    accumulate: int = 1
    val_every_steps: int = 250
    ckpt_every_steps: int = 250
    keep_checkpoints: int = 3  # newest N kept (0 = all)
    log_every_steps: int = 10
    compile: bool = False
    # shapes of the compiled model: null = torch's automatic dynamic shapes (static graph
    # first, one symbolic graph after a new length), true = symbolic from the start, false =
    # static graphs, one per batch width (pair it with data.pad_to_multiple)
    compile_dynamic: bool | None = None
    threads: int | None = None  # torch.set_num_threads; null = leave as is
    peak_flops: float | None = None  # for MFU; null = measured fp32 matmul rate on CPU
    progress_bar: bool = True
    # Lightning's own lines (a cloud-logger advertisement, "GPU available: ...") left out
    quiet: bool = True
    deterministic: bool = False
    # Non-finite loss or gradient: 0 = stop before the optimizer step (the default); N > 0 =
    # skip such steps (no parameter or optimizer-state change), at most N in the whole run.
    skip_nonfinite: int = 0
    # stop cleanly after this much training time, "DD:HH:MM:SS" (Lightning's max_time), checked
    # after each optimizer step; the checkpoint of the last step is written, exit status 0
    max_time: str | None = None
    profiler: str | None = None  # simple | advanced | pytorch: report under <run dir>/profiler/
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    detect_anomaly: bool = False  # torch.autograd anomaly detection (slow; finds the NaN's op)
    log_grad_norm: str = "global"  # none | global | layer (train/grad_norm[/<layer>], pre-clip)


@dataclass
class LoggerConfig:
    name: str = "csv"  # csv | tensorboard | wandb | many | none (the CSV log is kept but for none)
    loggers: list[str] = field(default_factory=list)  # logger=many: the loggers to use together
    project: str = "blocklab"
    mode: str = "offline"  # wandb: offline unless asked
    run_name: str | None = None  # null = the run directory's name (a sweep job: its varied keys)
    group: str | None = None  # null = none (a sweep job: the sweep directory's name)
    log_checkpoints: bool = False  # wandb: each checkpoint also as an artifact (opt-in: size)


@dataclass
class NeedleProbeConfig:
    """Needle-in-a-haystack grid: lengths × depths, ``n`` seeded samples per cell, once per
    distractor count (0 = a single needle: a shortcut task, reported but never quoted alone)."""

    enabled: bool = True
    lengths: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 1.5, 2.0, 4.0])
    depths: list[float] = field(default_factory=lambda: [i / 10 for i in range(11)])
    n_distractors: list[int] = field(default_factory=lambda: [2])
    n: int = 64
    fillers: list[str] = field(default_factory=lambda: ["iid", "phrase", "markov"])


@dataclass
class LitmProbeConfig:
    """Lost in the middle: key–value records with the gold record's position swept, the
    query-aware layout, and closed-book (records absent) / oracle (only the gold record)
    baselines."""

    enabled: bool = True
    n_records: list[int] = field(default_factory=lambda: [8, 16, 32])
    gold: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # × (m-1)
    n: int = 64
    query_aware: bool = True
    baselines: bool = True


@dataclass
class MultiNeedleProbeConfig:
    """RULER's needle variants (arXiv 2404.06654) over a filler haystack, every needle at a
    depth drawn per item: ``multikey`` (``keys`` needles with distinct keys, one queried),
    ``multivalue`` (the queried key carries ``values`` values, all must be returned in order of
    appearance; in token space each of the ``keys`` keys carries as many, so a model copying
    every value it sees cannot pass), ``multiquery`` (``keys`` needles, ``queries`` of them
    asked at once, every value returned in the order asked)."""

    enabled: bool = False
    variants: list[str] = field(default_factory=lambda: ["multikey", "multivalue", "multiquery"])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    keys: int = 4
    values: int = 4
    queries: int = 2
    n: int = 64


@dataclass
class HopsProbeConfig:
    """Variable tracking (multi-hop): a chain ``x1 = v; x2 = x1; ...`` of ``h`` assignments
    scattered in order through the haystack, with ``distractor_chains`` other chains; the
    question names the chain's last variable, the answer is its root value. Cells: hops ×
    length; every row records the depth of the farthest hop."""

    enabled: bool = False
    hops: list[int] = field(default_factory=lambda: [1, 2, 4])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    distractor_chains: int = 1
    n: int = 64


@dataclass
class AggregationProbeConfig:
    """Counting: ``candidates`` ids (text: words) scattered through the haystack; the most
    frequent occurs ``margin`` times more often than the runner-up; answer the most frequent.
    Cells: margin × length."""

    enabled: bool = False
    candidates: int = 4
    margins: list[int] = field(default_factory=lambda: [1, 2, 4])
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0])
    n: int = 64


@dataclass
class PerplexityProbeConfig:
    """Perplexity vs evaluation length (decoders): non-overlapping chunks and a sliding window
    (each window scores only its last ``stride`` fraction of tokens)."""

    enabled: bool = True
    lengths: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0])
    tokens: int = 4096  # tokens scored per length and mode
    stride: float = 0.5  # sliding window: fraction of the window scored per step


@dataclass
class TextProbeConfig:
    """Text-space builder (real tokenizers): templates and haystack."""

    haystack: str = "essay"  # essay (built-in plain sentences) | shakespeare | path to a .txt
    needle: str = "The special magic number for {key} is {value}."
    question: str = "What is the special magic number for {key}?"
    answer_prefix: str = "The special magic number for {key} is"
    record: str = '"{key}": "{value}"'  # litm: one key–value record per line
    record_question: str = 'What is the value of key "{key}"?'
    record_answer_prefix: str = 'The value of key "{key}" is "'
    chat_template: bool = False  # wrap question + answer prefix in the tokenizer's chat template
    # greedy generation length for the substring match (never fewer than the gold answer's
    # tokens + 4: a multi-value answer must fit)
    max_new_tokens: int = 16
    margin_candidates: int = 4  # multi-token answers: other in-context values scored per item
    add_bos: bool = True  # prepend the tokenizer's BOS once, at the start


@dataclass
class ProbeSpec:
    """One probe spec, rendered by the token-space builder (synthetic vocabularies) or the
    text-space builder (real tokenizers); scoring and reports are shared. Lengths are
    multiples of ``train_length`` (null = the checkpoint's ``data.seq_len``)."""

    enabled: bool = True
    name: str = "full"
    space: str = "auto"  # auto | token | text
    seed: int = 9999  # disjoint from training seeds: probe pairings are never trained on
    train_length: int | None = None
    threshold: float = 0.8  # effective context length: accuracy >= threshold at every L' <= L
    batch_size: int = 64
    needle: NeedleProbeConfig = field(default_factory=NeedleProbeConfig)
    litm: LitmProbeConfig = field(default_factory=LitmProbeConfig)
    multi_needle: MultiNeedleProbeConfig = field(default_factory=MultiNeedleProbeConfig)
    hops: HopsProbeConfig = field(default_factory=HopsProbeConfig)
    aggregation: AggregationProbeConfig = field(default_factory=AggregationProbeConfig)
    perplexity: PerplexityProbeConfig = field(default_factory=PerplexityProbeConfig)
    text: TextProbeConfig = field(default_factory=TextProbeConfig)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    probes: ProbeSpec = field(default_factory=ProbeSpec)  # at the end of training
    checkpoint_probes: ProbeSpec = field(default_factory=ProbeSpec)  # at every checkpoint save
    experiment_name: str = "default"
    seed: int = 0
    out_root: str = "outputs"
    run_dir: str | None = None  # set to continue in an existing directory (resume does it)
    resume: str | None = None  # run directory or checkpoint to continue exactly
    # start from pretrained weights: a blocklab checkpoint / run directory, a Hugging Face model
    # directory or hub id, or a .gguf file (architecture and tokenizer from the source)
    init_from: str | None = None
    allow_data_change: bool = False  # resume: accept a different data/tokenizer fingerprint
    objective: str = "val/loss"  # the metric a run returns to sweepers (Optuna minimizes it)
    # Lightning callbacks by name (configs/callbacks/*.yaml, train/callbacks.py): each key a
    # registered callback, its value that callback's options; open on purpose (user callbacks)
    callbacks: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalConfig:
    ckpt: str | None = None  # a run directory (newest valid checkpoint) or a checkpoint directory
    val_batches: int | None = None  # null = the run's data.val_batches
    batch_size: int | None = None  # null = the run's data.batch_size
    probes: ProbeSpec = field(default_factory=ProbeSpec)
    hf_model: str | None = None  # a Hugging Face causal LM directory instead of a checkpoint
    hf_gguf: str | None = None  # a GGUF file inside hf_model (dequantized on load)
    out: str | None = None  # output folder (default: next to the checkpoint)
    # the validation loss on the run's own data: auto = when that needs no file (synthetic
    # data), skipped for a text run; true = read the run's recorded text sources; false = none
    run_data: str = "auto"
    # another corpus to compute the loss and perplexity on ('data.files=[...]' or
    # data.val_files, or a data= option): its sources and reading format from here, tokenized
    # with the checkpoint's own tokenizer; sequence length, packing and masking from the run.
    # No sources = none.
    data: DataConfig = field(default_factory=lambda: DataConfig(name=DataName.text))


@dataclass
class ImportConfig:
    from_hf: str | None = None  # a Hugging Face model directory, or a hub id (network needed)
    gguf: str | None = None  # a GGUF file inside from_hf (llama architecture)
    out: str | None = None  # run directory to create, new or empty (default outputs/imported/<name>)
    ignore_fields: list[str] = field(default_factory=list)  # HF config keys declared harmless
    # true: replace an `out` that holds anything, whole. The import is written into a hidden
    # sibling (.tmp-<name>-<pid>) and swapped in only once complete (the old directory renamed
    # to .old-<name>-<pid>, the new one renamed in, then the old one deleted): a failure at any
    # point leaves the old content as it was. false: such an `out` is refused (exit 2).
    overwrite: bool = False


@dataclass
class ExportConfig:
    ckpt: str | None = None  # a run directory (newest valid checkpoint) or a checkpoint directory
    out: str | None = None  # a new (or empty) directory for the Hugging Face files
    arch: str | None = None  # llama | gpt2 | bert | t5 (null = the one that expresses the model)
    # true: replace an `out` that holds anything, whole, as import's overwrite does (written
    # beside it, swapped in once complete; a failure leaves the old content as it was).
    overwrite: bool = False


@dataclass
class GenerateConfig:
    """``blocklab-generate``: sample from a run, a checkpoint or an import (nanoGPT's
    sample.py, ``litgpt generate`` / ``chat``)."""

    ckpt: str | None = None  # a run directory (newest valid checkpoint), a checkpoint, an import
    prompt: str | None = None  # the text to continue (null and no prompt_file: from BOS alone)
    prompt_file: str | None = None  # a UTF-8 file whose whole content is the prompt
    interactive: bool = False  # read prompts from stdin, one a line, until end of input
    chat: bool = False  # wrap each prompt in the tokenizer's chat template (imported models)
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0 = greedy (argmax)
    top_k: int | None = 200  # null or 0 = off
    top_p: float | None = None  # nucleus sampling; null or 1 = off
    seed: int | None = 0  # a torch.Generator of its own (null = a fresh random seed each run)
    num_samples: int = 1  # samples per prompt, drawn one after another from one generator
    stop_at_eos: bool = True  # stop a sample at the tokenizer's end-of-sequence id
    device: str = "auto"  # auto (cuda when available, else cpu) | cpu | cuda | cuda:N | mps
    threads: int | None = None  # CPU threads for torch (null = torch's default)


@dataclass
class EstimateConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 1
    seq_len: int | None = None  # null = model.max_seq_len
    bytes_per_value: int = 2  # KV cache / activation dtype size (2 = bf16/fp16)


def resolve_kv_heads(m: ModelConfig) -> int:
    """Number of K/V heads implied by the head layout (``attention.name``: MHA / GQA / MQA, or
    a registered one) and ``n_kv_heads``: the layout decides (model/attention.py)."""
    from blocklab.registry import lookup

    layout = lookup("attention", m.attention.name, "model.attention.name")
    return layout.kv_heads(m.attention, m.n_heads)
