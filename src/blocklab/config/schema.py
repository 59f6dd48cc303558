"""The config schema: structured dataclasses Hydra composes YAML onto (unknown keys and wrong
types fail at compose time), the choices that are not component names, and the facts of the
synthetic vocabulary the rules need."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from blocklab.config.choices import (  # noqa: F401 (re-exported)
    ACCELERATORS,
    BEST_MODES,
    DATA_FORMATS,
    DOCUMENT_SPLITS,
    FORMAT_SUFFIXES,
    GRAD_NORMS,
    LONG_DOCUMENTS,
    PRECISIONS,
    PROBE_SPACES,
    PROFILERS,
    ROW_METRICS,
    SEGMENT_MODES,
    SOURCE_FINGERPRINTS,
    STRATEGIES,
    TEXT_HAYSTACKS,
    UTF8_ERRORS,
    WANDB_MODES,
    WEIGHT_DECAY_MODES,
)
from blocklab.config.facts import (  # noqa: F401 (re-exported: old imports keep working)
    COUNTING_CANDIDATES,
    COUNTING_MARGINS,
    COUNTING_MAX_COUNT,
    FILLERS,
    FLIP_FLOP_SYMBOLS,
    FLIP_FLOP_WRITE,
    MARKOV_MIN_FILLER,
    MQAR_LAYOUTS,
    MULTI_NEEDLE_VARIANTS,
    MULTIHOP_DISTRACTOR_CHAINS,
    MULTIHOP_HOPS,
    ZOOLOGY_POWER_A,
    counting_choices,
    counting_min_length,
    distinct_ids,
    distinct_pairs,
    mqar_min_length,
    multi_needle_answer_length,
    multi_needle_min_length,
    multi_needle_needles,
    multihop_choices,
    multihop_min_length,
    needle_min_length,
)

# The model axes' dataclasses live in model_schema.py; re-exported so that every
# ``blocklab.config.schema`` import keeps working.
from blocklab.config.model_schema import (  # noqa: F401
    GELU_FORMS,
    AttentionConfig,
    BlockConfig,
    FamilyConfig,
    FFNConfig,
    MixerConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScaling,
    resolve_kv_heads,
)
from blocklab.config.monitor_schema import MonitorConfig  # re-exported, used below
from blocklab.config.probe_schema import (  # noqa: F401 (re-exported)
    AggregationProbeConfig,
    BabilongProbeConfig,
    HopsProbeConfig,
    LitmProbeConfig,
    MultiNeedleProbeConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    ProbeSpec,
    TextProbeConfig,
)


class DataName(enum.Enum):
    synthetic = "synthetic"
    text = "text"
    babilong = "babilong"  # bAbI stories hidden in real text (data/babilong_train.py)


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
    """Mixture weight of each of blocklab's synthetic tasks (``blocklab.data.tasks``,
    ``TASKS``); 0 = not used. A user's registered task is weighted in ``data.user_tasks``."""

    needle: float = 1.0
    kv_records: float = 0.0
    kv_records_query_aware: float = 0.0
    mqar: float = 0.0
    copy: float = 0.0
    markov_lm: float = 0.0
    multihop: float = 0.0  # variable tracking: chains of assignments, answer the root value
    counting: float = 0.0  # aggregation: the most frequent of several candidate ids
    flip_flop: float = 0.0  # state held and overwritten: the value of the last write
    listops: float = 0.0  # nested MIN/MAX/MED/SM over digits, answer first (encoders; LRA)


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
    # user tasks (register("task", name)): name -> mixture weight; blocklab's are data.tasks
    user_tasks: dict[str, float] = field(default_factory=dict)
    # synthetic: the tasks validation draws from (their data.tasks weights; [] = every task
    # trained on), e.g. [mqar]: val/accuracy of recall alone while copying is in the mix
    val_tasks: list[str] = field(default_factory=list)
    # synthetic: validation sequences drawn at this length (null: lengths drawn as training's,
    # min_len to seq_len; a task may give a few tokens fewer, e.g. copying an even count)
    val_len: int | None = None
    n_distractors: list[int] = field(default_factory=lambda: [1, 3])  # inclusive range
    # mqar: null = records then every key queried (as many pairs as fit); n = Zoology's layout
    # (n pairs, then n queries spread among filler over the whole length)
    mqar_pairs: int | None = None
    # with mqar_pairs: draw each sequence's pair count uniformly from [mqar_min_pairs,
    # mqar_pairs] (null = always mqar_pairs); easy few-pair sequences bootstrap recall
    mqar_min_pairs: int | None = None
    # with mqar_pairs: spread = BOS, records, then ``SEP k v`` queries at uniform places among
    # i.i.d. filler; zoology = the paper's exactly (Zoology's _mqar, Figure 2): records, then
    # each key once in a 2-token slot at power-law distance after them (p ∝ g^-0.99, g = 1, ...:
    # most queries close), its value the target, one constant filler id everywhere else
    mqar_layout: str = "spread"
    # listops: blank tokens between the answer slot and the expression (how far the slot is
    # from the root operator, LRA's classifier's situation; 0 = the expression right after it)
    listops_gap: int = 0
    # multihop: training draws each sequence's hop count from this inclusive range (what fits
    # its length; probes set their own hops)
    multihop_hops: list[int] = field(default_factory=lambda: list(MULTIHOP_HOPS))
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
    # memory across segments of seq_len tokens: none | split (one document an example, RMT) |
    # stream (text as batch_size lanes, Transformer-XL's batchify; data/lanes.py)
    segment_mode: str = "none"
    doc_len: int | None = None  # split: the longest document, whole segments (null: seq_len)
    # babilong: the bAbI tasks drawn (qa1..qa5, equal weights), the span of context depths the
    # facts lie in, facts per story (null: each task's usual size; qa4 always 2) and the text
    # they are hidden in: essay | shakespeare | a text file (its last 10 % validates)
    babilong_tasks: list[str] = field(default_factory=lambda: ["qa1"])
    babilong_depth: list[float] = field(default_factory=lambda: [0.0, 1.0])
    babilong_facts: int | None = None
    haystack: str = "shakespeare"


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | sgd | lion | adafactor, or a registered one (train/optim.py)
    lr: float = 1e-3
    # on the weights of linear layers only (train/optim.py param_groups), for every optimizer:
    # decoupled for adamw / lion / adafactor, L2 (added to the gradient) for sgd
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # adamw, lion
    eps: float = 1e-8  # adamw
    # coupled: AdamW's lr * weight_decay per step; independent: weight_decay * lr / optim.lr
    # (the schedule's shape, not the rate: Wortsman et al. 2023's "independent" decay)
    weight_decay_mode: str = "coupled"
    z_loss: float = 0.0  # weight of the mean log²Z of the output logits over targets (PaLM: 1e-4)
    grad_clip: float = 1.0  # 0 = off
    momentum: float = 0.9  # sgd
    nesterov: bool = False  # sgd


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | constant | linear
    # the linear warmup: a number of steps, or a fraction of trainer.max_steps (rounded up);
    # set one, the other null
    warmup_steps: int | None = 100
    warmup_ratio: float | None = None
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
    # also keep the best checkpoint (never pruned while it is the best; `ckpt=<run>:best`): the
    # one whose step's row holds the best best_monitor
    keep_best: bool = True
    # null: early stopping's monitor and mode when it is configured, else val/loss (lower is
    # better); or one of ROW_METRICS (val/accuracy: higher is better)
    best_monitor: str | None = None
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
    # segment modes: stream = segments per training row (one backward each); split = detach
    # the carried state every bptt segments (0 = never: backward through the whole document)
    bptt: int = 1


@dataclass
class LoggerConfig:
    name: str = "csv"  # csv | tensorboard | wandb | many | none (the CSV log is kept but for none)
    loggers: list[str] = field(default_factory=list)  # logger=many: the loggers to use together
    project: str = "blocklab"
    mode: str = "offline"  # wandb: offline unless asked
    run_name: str | None = None  # null = the run directory's name (a sweep job: its varied keys)
    group: str | None = None  # null = none (a sweep job: the sweep directory's name)
    # tags to filter runs by (wandb's run tags; every logger has them in the config); a sweep
    # job also gets one per varied key, e.g. model/position=alibi
    tags: list[str] = field(default_factory=list)
    log_checkpoints: bool = False  # wandb: each checkpoint also as an artifact (opt-in: size)


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
    monitors: MonitorConfig = field(default_factory=MonitorConfig)  # stability monitors
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
    # another corpus to compute the loss and perplexity on (data.files / data.val_files / a
    # data= option; eval/rundata.py corpus_config). No sources = none.
    data: DataConfig = field(default_factory=lambda: DataConfig(name=DataName.text))
    # lm-evaluation-harness tasks, few-shot count, examples per task, a task YAML directory
    harness: list[str] = field(default_factory=list)
    harness_fewshot: int | None = None
    harness_limit: float | None = None
    harness_include: str | None = None


@dataclass
class ImportConfig:
    from_hf: str | None = None  # a Hugging Face model directory, or a hub id (network needed)
    gguf: str | None = None  # a GGUF file inside from_hf (llama architecture)
    out: str | None = None  # run directory to create, new or empty (default outputs/imported/<name>)
    ignore_fields: list[str] = field(default_factory=list)  # HF config keys declared harmless
    # true: replace an `out` that holds anything, whole (written into a hidden sibling, swapped
    # in once complete: a failure leaves the old content as it was); false: refused (exit 2).
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
    threads: int | None = 1  # CPU threads for torch (1: measured fastest; null = torch's default)


@dataclass
class EstimateConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 1
    seq_len: int | None = None  # null = model.max_seq_len
    bytes_per_value: int = 2  # KV cache / activation dtype size (2 = bf16/fp16)
