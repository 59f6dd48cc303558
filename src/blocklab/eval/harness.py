"""blocklab checkpoints inside lm-evaluation-harness (``lm-eval``; Gao et al., "A framework for
few-shot language model evaluation", EleutherAI, and Biderman et al. 2024, arXiv 2405.14782).

:class:`HarnessModel` answers the harness's three request types for any blocklab checkpoint,
through the run's own objective (objectives/, via :class:`~blocklab.eval.backends.BlocklabBackend`):
the batch format, shift and masking the model was trained with, so every decoder mixer
(softmax, window, linear, conv, SSM, hybrids) and every segment-mode / memory model is read the
way its probes read it.

- ``loglikelihood(context, continuation)``: tokenized as the harness's ``HFLM`` does (the
  context's trailing spaces moved to the continuation; the whole string encoded once and the
  continuation the tokens past the context's own encoding), the checkpoint's BOS first where
  its training sequences began with one. Requests that share a context are scored from one
  KV-cached run of it (``objective.score_prefix``) where the objective shares prefixes (causal
  LMs); otherwise (segment modes, encoder–decoder) teacher-forced in batches.
- ``loglikelihood_rolling(text)``: every token scored once, in non-overlapping windows that each
  begin with the prefix token (BOS), as eval/perplexity.py reads the validation text; windows
  of ``max_length`` tokens (default: the run's training length, never past the positions the
  model can index; a segment-mode model reads the whole text, segment by segment).
- ``generate_until(context, gen_kwargs)``: greedy decoding through the objective
  (``blocklab.model.generate`` with the KV cache for decoders), cut at EOS and at the first of
  the ``until`` strings; ``max_gen_toks`` tokens at most.

The encoder family predicts masked slots in place and has no left-to-right likelihood: it is
refused. An encoder–decoder scores a continuation as its target given the context as its
source, and generates; it has no rolling likelihood (not a causal LM). The lm-eval ``LM``
subclass (:func:`lm_class`, registered as ``blocklab``) is made on first use, so importing this
module never imports lm-eval (``pip install 'blocklab[harness]'``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from blocklab.config.checks import require

#: The default number of tokens ``generate_until`` may add when a task does not say
#: (``max_gen_toks``; the harness's own default).
MAX_GEN_TOKS = 256


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")


class HarnessModel:
    """A blocklab model and its checkpoint's tokenizer, answering lm-eval's requests as plain
    Python (no lm-eval needed): :meth:`loglikelihood`, :meth:`loglikelihood_rolling`,
    :meth:`generate_until`, all batched ``batch_size`` rows at a time."""

    def __init__(self, model: torch.nn.Module, meta: dict[str, Any], tc, *, batch_size: int = 8,
                 max_length: int | None = None, add_bos: bool | None = None,
                 max_gen_toks: int = MAX_GEN_TOKS) -> None:
        import dataclasses

        from blocklab.data.tokenizer import Specials, tokenizer_from_json
        from blocklab.eval.backends import BlocklabBackend
        from blocklab.eval.onmodel import train_length
        from blocklab.objectives import build_objective

        self.family = tc.model.family.name
        if self.family == "encoder":
            require(False,
                    "model.family.name", "encoder", "lm-evaluation-harness scores left-to-right "
                    "continuations; a masked LM predicts masked slots in place and has no "
                    "continuation likelihood or greedy continuation")
        if json.loads(meta["tokenizer"]).get("kind") == "synthetic":
            require(False,
                    "tokenizer.name", "synthetic", "harness tasks are text; this checkpoint's "
                    "vocabulary is blocklab's synthetic symbols (train with a text tokenizer)")
        self.model = model.eval()
        self.specials = Specials.from_dict(meta.get("specials"))
        objective = build_objective(self.family, dataclasses.replace(tc.data, packing=False),
                                    self.specials)
        self.backend = BlocklabBackend(self.model, objective)
        self.causal = objective.causal_lm
        self.tok = tokenizer_from_json(meta["tokenizer"])
        bos = meta.get("text_bos", True) if add_bos is None else _flag(add_bos)
        self.head = [self.specials.bos] if bos and self.causal else []
        # an empty context, and every perplexity window, starts from this token (HFLM's prefix)
        self.prefix = self.head or [self.specials.eos]
        self.positions = self.model.max_positions  # None: any length
        train = train_length(meta, tc)[1]
        if max_length is not None:
            max_length = int(max_length)
            if max_length < 2 or (self.positions is not None and max_length > self.positions):
                require(False, "max_length", max_length, "at least 2 and at most the "
                        f"{self.positions} positions the model can index")
        self.limit = max_length or self.positions  # longest scored input (None: any)
        # a segment-mode model reads a long text segment by segment (data.seq_len is one
        # segment): its perplexity window is the whole text, up to the positions it can index
        segmented = getattr(tc.data, "segment_mode", "none") != "none"
        self.window = max_length or (self.positions if segmented else min(
            train, self.positions or train))  # None: the whole text
        self.batch_size, self.max_gen_toks = max(1, int(batch_size)), int(max_gen_toks)

    @classmethod
    def from_checkpoint(cls, target: str | Path, **kw: Any) -> HarnessModel:
        """A run directory (its newest complete checkpoint) or a checkpoint directory."""
        from blocklab import checkpoint as ckpt

        loaded = ckpt.read(target)
        model, _ = ckpt.model_of(loaded)
        return cls(model, loaded.meta, loaded.config, **kw)

    # ------------------------------------------------------------------------- tokenization
    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens) as HFLM splits them: trailing spaces of the
        context go to the continuation, the whole string is encoded once and the continuation
        is what follows the context's own encoding; BOS first (an empty context: the prefix
        token)."""
        if not context:
            return list(self.prefix), self.encode(continuation)
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        if not self.causal:  # a source and a target: each encoded on its own (as lm-eval)
            return self.encode(context), self.encode(continuation)
        whole, ctx = self.encode(context + continuation), self.encode(context)
        return self.head + ctx, whole[len(ctx):]

    # ----------------------------------------------------------------------------- scoring
    def _fit(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """The pair left-truncated to the positions the model can index (as HFLM does)."""
        if not self.causal or self.limit is None or len(ctx) + len(cont) - 1 <= self.limit:
            return ctx, cont
        if len(cont) > self.limit:
            require(False,
                    "max_length", self.limit, f"a continuation of {len(cont)} tokens does not "
                    "fit the positions the model reads")
        return ctx[len(ctx) + len(cont) - 1 - self.limit:], cont

    @torch.no_grad()
    def score_tokens(self, pairs: Sequence[tuple[list[int], list[int]]]
                     ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probs, whether greedy decoding would produce it) of
        each (context tokens, continuation tokens) pair."""
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        todo = []
        for i, (ctx, cont) in enumerate(pairs):
            if not cont:
                out[i] = (0.0, True)
            else:
                todo.append((i, *self._fit(list(ctx), list(cont))))
        if self.backend.shares_prefix:
            self._shared(todo, out)
        else:
            self._forced(todo, out)
        return out  # type: ignore[return-value]

    def _shared(self, todo: list, out: list) -> None:
        """Pairs grouped by context: each context runs once, its continuations scored from the
        cache (``batch_size`` continuations per call)."""
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i, ctx, cont in todo:
            groups.setdefault(tuple(ctx), []).append((i, cont))
        calls: list[list[tuple[tuple[int, ...], list[tuple[int, list[int]]]]]] = [[]]
        count = 0
        for key in sorted(groups, key=len, reverse=True):
            items = groups[key]
            for s in range(0, len(items), self.batch_size):
                part = items[s:s + self.batch_size]
                if count + len(part) > self.batch_size and calls[-1]:
                    calls.append([])
                    count = 0
                calls[-1].append((key, part))
                count += len(part)
        for call in calls:
            if not call:
                continue
            res = self.backend.score_from_prefix([list(k) for k, _ in call],
                                                 [[c for _, c in part] for _, part in call], 0)
            for (_, part), (lps, _) in zip(call, res):
                for (i, cont), lp in zip(part, lps):
                    out[i] = _total(lp, cont)

    def _forced(self, todo: list, out: list) -> None:
        """Teacher-forced, ``batch_size`` pairs per forward, longest first."""
        todo = sorted(todo, key=lambda t: -(len(t[1]) + len(t[2])))
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            logp, _ = self.backend.answer_logprobs([c for _, c, _ in chunk],
                                                   [a for _, _, a in chunk])
            for r, (i, _, cont) in enumerate(chunk):
                out[i] = _total(logp[r, : len(cont)], cont)

    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        return self.score_tokens([self.encode_pair(c, x) for c, x in requests])

    def rolling_windows(self, text: str) -> list[tuple[list[int], list[int]]]:
        """Non-overlapping windows of the text's tokens, each scored after the prefix token
        (its input ``self.window`` tokens at most), every token exactly once."""
        tokens = self.encode(text)
        body = self.window or max(len(tokens), 1)
        return [(list(self.prefix), tokens[s:s + body]) for s in range(0, len(tokens), body)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        if not self.causal:
            require(False,
                    "model.family.name", self.family, "a rolling log-likelihood (perplexity) "
                    "needs a causal LM")
        windows = [self.rolling_windows(t) for t in texts]
        scores = self.score_tokens([w for ws in windows for w in ws])
        out, k = [], 0
        for ws in windows:
            out.append(sum(s for s, _ in scores[k:k + len(ws)]))
            k += len(ws)
        return out

    # -------------------------------------------------------------------------- generation
    @torch.no_grad()
    def generate_until(self, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
        """Greedy continuations, batched by equal generation settings, longest prompt first."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, (_, kw) in enumerate(requests):
            groups.setdefault(json.dumps(kw, sort_keys=True, default=str), []).append(i)
        for idx in groups.values():
            until, n = self._settings(requests[idx[0]][1])
            prompts = {i: self._prompt(requests[i][0], n) for i in idx}
            idx = sorted(idx, key=lambda i: -len(prompts[i]))
            for s in range(0, len(idx), self.batch_size):
                chunk = idx[s:s + self.batch_size]
                for i, g in zip(chunk, self.backend.greedy([prompts[i] for i in chunk], n)):
                    out[i] = self._text(g, until)
        return out  # type: ignore[return-value]

    def _settings(self, kw: dict[str, Any]) -> tuple[list[str], int]:
        kw = dict(kw or {})
        if _flag(kw.get("do_sample", False)) or float(kw.get("temperature") or 0.0) > 0:
            require(False,
                    "gen_kwargs.do_sample", kw.get("do_sample"), "the blocklab harness model "
                    "decodes greedily (do_sample=false, temperature=0)")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        n = int(kw.get("max_gen_toks", self.max_gen_toks))
        if self.limit is not None and n >= self.limit:
            require(False,
                    "max_gen_toks", n, f"fewer than the {self.limit} positions the model reads")
        return until, n

    def _prompt(self, context: str, n: int) -> list[int]:
        ids = self.head + self.encode(context) if context else list(self.prefix)
        if self.limit is not None and len(ids) + n > self.limit:
            ids = ids[len(ids) + n - self.limit:]
        return ids

    def _text(self, tokens: list[int], until: list[str]) -> str:
        eos = self.specials.eos
        if eos in tokens:
            tokens = tokens[: tokens.index(eos)]
        text = self.decode(tokens)
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text


def _total(lp: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(summed log-prob of ``cont`` under the (len, V) log-distributions, greedy match)."""
    ids = torch.tensor(cont, dtype=torch.long)
    return (float(lp.gather(-1, ids[:, None]).sum()), bool((lp.argmax(-1) == ids).all()))


# ------------------------------------------------------------------ the lm-eval model class
_CLASS: list[type] = []


def lm_class() -> type:
    """The lm-eval ``LM`` subclass over :class:`HarnessModel`, registered as ``blocklab`` (made
    once, on first use: lm-eval is imported here, never at module import)."""
    if _CLASS:
        return _CLASS[0]
    # lm-eval's own models first: its registry loads them only while empty, so a registry
    # holding ``blocklab`` alone would lose ``hf``
    import lm_eval.models  # noqa: F401
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model

    class BlocklabLM(LM):
        """``lm_eval --model blocklab --model_args ckpt=<run or checkpoint>[,max_length=N]
        [,add_bos=false][,max_gen_toks=N]`` (``--batch_size`` as for any model)."""

        def __init__(self, ckpt: str | None = None, batch_size: Any = 8,
                     max_batch_size: Any = None, device: Any = None,
                     model: HarnessModel | None = None, **kw: Any) -> None:
            super().__init__()
            if model is None:
                if not ckpt:
                    require(False,
                            "ckpt", ckpt, "required (--model_args ckpt=<run or checkpoint dir>)")
                if str(device or "cpu") not in ("cpu", "None"):  # lm-eval's default: cuda:0
                    import sys

                    print(f"note: device={device!r}: the blocklab harness model runs on the "
                          "CPU", file=sys.stderr)
                size = 8 if str(batch_size).startswith("auto") else int(batch_size)
                model = HarnessModel.from_checkpoint(ckpt, batch_size=size, **kw)
            self.blocklab, self._name = model, f"blocklab:{ckpt or 'model'}"

        @property
        def tokenizer_name(self) -> str:
            return self._name

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            out = self.blocklab.loglikelihood([r.args for r in requests])
            for r, res in zip(requests, out):
                self.cache_hook.add_partial("loglikelihood", r.args, res)
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            out = self.blocklab.loglikelihood_rolling([r.args[0] for r in requests])
            for r, res in zip(requests, out):
                self.cache_hook.add_partial("loglikelihood_rolling", r.args, res)
            return out

        def generate_until(self, requests, disable_tqdm: bool = False):
            out = self.blocklab.generate_until([(r.args[0], r.args[1]) for r in requests])
            for r, res in zip(requests, out):
                self.cache_hook.add_partial("generate_until", r.args, res)
            return out

    _CLASS.append(register_model("blocklab")(BlocklabLM))
    return BlocklabLM


def register() -> type:
    """Register ``blocklab`` with lm-eval's model registry (idempotent)."""
    return lm_class()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m blocklab.eval.harness <lm_eval arguments>`` (and ``blocklab-harness``):
    ``blocklab`` registered, then lm-eval's own command line, unchanged."""
    import sys

    register()
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
