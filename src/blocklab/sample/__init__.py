"""``blocklab-generate``: samples from a run, a checkpoint or an import, streamed as they come
(nanoGPT's sample.py, ``litgpt generate`` / ``litgpt chat``).

- **What is read.** The checkpoint once (``checkpoint.read``: verified, its config checked as
  data) and the model rebuilt from it; the tokenizer, its special ids, whether its text starts
  with BOS (``text_bos``) and the chat template (kept by ``blocklab-import``) all come from the
  checkpoint's metadata, never from a path it names.
- **Prompts.** ``prompt=``, ``prompt_file=`` (the whole file) or ``interactive=true`` (stdin,
  one prompt a line, until end of input). Text is encoded without the tokenizer's own
  post-processing and gets BOS where the model's text begins with it, as training and the
  probes see it. ``chat=true`` renders the chat template as Hugging Face's
  ``apply_chat_template(add_generation_prompt=True)`` does (a sandboxed Jinja environment) and
  encodes the result with its special markers; the template supplies BOS itself.
- **Sampling** is :func:`blocklab.model.generate.generate` (greedy, temperature, top-k,
  top-p) with a ``torch.Generator`` of its own seeded from ``seed`` (never the global RNG), so
  a seed reproduces its samples on the same device; a sample stops at the tokenizer's EOS
  unless ``stop_at_eos=false``.
- **Streaming.** Each token is decoded incrementally (the text of everything so far, minus
  what was printed; a piece ending in an incomplete UTF-8 character waits for the next token),
  written and flushed at once; tokens/s goes to stderr when a prompt is answered.
- **A bounded position table** (learned positions: ``model.max_positions``) is sampled past
  with a sliding context: each token past the table is predicted from the last
  ``max_seq_len`` tokens, as nanoGPT's sampler crops to its block size. The KV cache cannot
  slide (its keys were computed at positions the cropped window renumbers), so each such token
  re-runs the model over the cropped window: exact, and slower. Rotary, relative and ALiBi
  models just continue.
- **Token space.** A run on the synthetic vocabulary has no text: prompts and output are token
  names (``<bos>``, ``<sep>``, ... ``f<i>`` filler, ``k<i>`` keys, ``v<i>`` values) or ids.
- **Failures are one line.** Any ``max_new_tokens`` samples (the KV cache grows with the
  sample, model/kv.py); memory that runs out is an I/O error naming ``max_new_tokens`` (exit
  6); logits that are not finite (NaN weights) a numerical error naming the checkpoint and
  the token (exit 5), before anything is sampled from them. Standard output that is full or
  closed is the command line's (``errors.standard_output``).
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from blocklab import checkpoint as ckpt
from blocklab.config.schema import GenerateConfig
from blocklab.data.synthetic import Vocab
from blocklab.data.tokenizer import Specials
from blocklab.errors import ConfigError, NumericalError, ResourceError
from blocklab.faults import maybe_fault
from blocklab.model.generate import generate
from blocklab.sample.prompts import (  # noqa: F401  (re-exported: blocklab.sample.<name>)
    encode,
    parse_tokens,
    prompt_file,
    read_prompts,
    render_chat,
    token_name,
    token_names,
)

#: Prompt tokens decoded with the output, so the first piece joins the prompt as in the whole
#: text (a leading space, a character split across tokens).
CONTEXT_TOKENS = 8
#: The exit code of an interrupted command (Ctrl-C), as for a preempted run.
INTERRUPTED = 7


@dataclass
class Sampler:
    """A checkpoint ready to sample: the model (eval mode, on its device), its tokenizer (a
    ``tokenizers.Tokenizer``, or the synthetic :class:`Vocab`) and what the metadata says."""

    model: torch.nn.Module
    tokenizer: Any
    specials: Specials
    text_bos: bool
    chat_template: str | None
    family: str
    where: str
    said_sliding: bool = False  # the sliding-context note is said once

    @property
    def token_space(self) -> bool:
        return isinstance(self.tokenizer, Vocab)

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def pick_device(device: str) -> torch.device:
    """``auto``: CUDA when there is one, else the CPU; a device that is not here is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    here = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    kind = device.split(":")[0]
    if not here.get(kind, True):
        raise ConfigError(f"config error: device={device!r}: no {kind} device here; use "
                          "device=cpu (or auto)")
    return torch.device(device)


def load_sampler(target: str | Path, device: str = "auto") -> Sampler:
    """Read the checkpoint ``target`` names (a run directory: its newest valid one) and build
    its model on ``device``."""
    loaded = ckpt.read(target)
    family = loaded.config.model.family.name
    if family == "encoder":
        raise ConfigError(f"config error: ckpt={str(target)!r}: an encoder (masked LM) cannot "
                          "generate; blocklab-generate samples decoder and encoder_decoder models")
    model, tokenizer = ckpt.model_of(loaded)
    template = loaded.meta.get("chat_template")
    return Sampler(model.to(pick_device(device)), tokenizer,
                   Specials.from_dict(loaded.meta.get("specials")),
                   bool(loaded.meta.get("text_bos", True)),
                   template if isinstance(template, str) else None, family, str(loaded.path))


# ------------------------------------------------------------------------------ sampling


class Pieces:
    """Incremental decoding: :meth:`push` returns the text a token adds to what was printed
    (empty while a UTF-8 character is incomplete), :meth:`flush` what is left at the end; the
    pieces concatenate to the decoding of all tokens after ``context``."""

    def __init__(self, decode: Callable[[list[int]], str], context: list[int]) -> None:
        self.decode, self.ids = decode, list(context)
        self.skip, self.done = len(decode(self.ids)), 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._take(final=False)

    def flush(self) -> str:
        return self._take(final=True)

    def _take(self, *, final: bool) -> str:
        text = self.decode(self.ids)[self.skip:]
        if not final and text.endswith("\ufffd"):
            return ""
        piece, self.done = text[self.done:], len(text)
        return piece


def continue_ids(s: Sampler, ids: list[int], gc: GenerateConfig, generator: torch.Generator,
                 on_token: Callable[[int], None], err: TextIO) -> list[int]:
    """Up to ``max_new_tokens`` new ids after ``ids`` (an encoder-decoder: after its decoder
    start, ``ids`` its source), sliding past a bounded position table."""
    eos = s.specials.eos if gc.stop_at_eos else None
    kw: dict[str, Any] = {"temperature": gc.temperature, "top_k": gc.top_k or None,
                          "top_p": gc.top_p, "generator": generator, "eos_id": eos,
                          "on_token": lambda t: on_token(int(t[0]))}
    context = decoder_context(s, ids)
    if s.family == "encoder_decoder":
        kw["source_ids"] = torch.tensor([ids], device=s.device)

    def run(prefix: list[int], n: int) -> list[int]:
        return generate(s.model, torch.tensor([prefix], device=s.device), max_new_tokens=n,
                        **kw)[0].tolist()

    limit, n = s.model.max_positions, gc.max_new_tokens
    if limit is None or len(context) + n - 1 <= limit:
        return run(context, n)
    _say_sliding(s, limit, len(context), err)
    context = context[-limit:]
    new = run(context, min(n, limit - len(context) + 1))
    while len(new) < n and not (eos is not None and new[-1] == eos):
        new += run((context + new)[-limit:], 1)  # the KV cache cannot slide: re-prefill
    return new


def decoder_context(s: Sampler, ids: list[int]) -> list[int]:
    """What the decoder continues: the prompt, or an encoder-decoder's start token (its prompt,
    the source, must fit the encoder's position table)."""
    if s.family != "encoder_decoder":
        return ids
    limit = getattr(s.model, "max_source_positions", None)
    if limit is not None and len(ids) > limit:
        raise ConfigError(f"config error: prompt: {len(ids)} tokens; the encoder's position "
                          f"table holds model.max_seq_len={limit}")
    return [s.specials.bos]


def say_notes(s: Sampler, ids: list[int], gc: GenerateConfig, err: TextIO) -> None:
    """What a prompt's samples need said, before anything of them is printed (stdout and stderr
    share a terminal: a note written mid-sample would split its line)."""
    limit, context = s.model.max_positions, decoder_context(s, ids)
    if limit is not None and len(context) + gc.max_new_tokens - 1 > limit:
        _say_sliding(s, limit, len(context), err)


def _say_sliding(s: Sampler, limit: int, prompt: int, err: TextIO) -> None:
    if s.said_sliding:
        return
    s.said_sliding = True
    cropped = (f"; the prompt's first {prompt - limit} tokens are cropped" if prompt > limit
               else "")
    err.write(f"note: the model's position table holds model.max_seq_len={limit} positions: "
              f"sampling past it with a sliding context of the last {limit} tokens{cropped} "
              "(each token past the table re-runs the model over that window: exact, slower "
              "than the KV cache)\n")
    err.flush()


@dataclass
class Stream:
    """Where samples go: each piece written and flushed at once; the fault point ``token:N``
    (tests) fires right after the N-th token of the process was written."""

    out: TextIO
    tokens: int = 0

    def write(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()

    def token(self, piece: str) -> None:
        self.write(piece)
        self.tokens += 1
        maybe_fault("token", self.tokens)


def _printer(s: Sampler, ids: list[int], echo: bool, stream: Stream
             ) -> tuple[Callable[[int], None], Callable[[], str]]:
    """(what to do with each new token, what is left to print at the end of the sample). An
    echoed prompt's last tokens are decoded with the sample, so that the sample joins it as in
    the whole text; a reply (chat, interactive) is decoded alone, as Hugging Face prints one (no
    leading space from a word-joining or SentencePiece decoder)."""
    if s.token_space:
        sep = [" " if echo else ""]

        def name(token: int) -> None:
            stream.token(sep[0] + token_name(s.tokenizer, token))
            sep[0] = " "

        return name, lambda: ""
    pieces = Pieces(s.decode, ids[-CONTEXT_TOKENS:] if echo else [])
    return lambda token: stream.token(pieces.push(token)), pieces.flush


def answer(s: Sampler, key: str, text: str, gc: GenerateConfig, generator: torch.Generator,
           stream: Stream, err: TextIO) -> None:
    """Every sample of one prompt, streamed; a completion (no chat, not interactive) prints the
    prompt first, as nanoGPT's sampler does. Tokens/s on stderr."""
    ids = encode(s, text, chat=gc.chat, key=key)
    say_notes(s, ids, gc, err)
    echo = not (gc.chat or gc.interactive)
    t0, total = time.perf_counter(), 0
    for i in range(gc.num_samples):
        if i:
            stream.write("---\n")
        if echo:
            stream.write(text)
        on_token, finish = _printer(s, ids, echo and bool(text.strip()), stream)
        sampled = [0]

        def counted(token: int, on_token=on_token, sampled=sampled) -> None:
            sampled[0] += 1
            on_token(token)

        where = f"{key}" + (f", sample {i + 1}" if gc.num_samples > 1 else "")
        try:
            total += len(continue_ids(s, ids, gc, generator, counted, err))
        except FloatingPointError:
            raise not_finite(s, sampled[0] + 1, where) from None
        except (RuntimeError, MemoryError) as e:
            if not out_of_memory(e):
                raise
            raise ResourceError(errno.ENOMEM, f"I/O error: out of memory sampling {where} on "
                                f"{s.device} at new token {sampled[0] + 1} (a prompt of "
                                f"{len(ids)} tokens, max_new_tokens={gc.max_new_tokens}); ask "
                                "for fewer new tokens or a shorter prompt, or sample on a "
                                "device with more memory (device=)") from None
        stream.write(finish() + "\n")
    seconds = time.perf_counter() - t0
    err.write(f"{key}: {len(ids)} prompt tokens, {total} new tokens in {seconds:.2f} s "
              f"({total / max(seconds, 1e-9):.1f} tokens/s)\n")
    err.flush()


def not_finite(s: Sampler, token: int, where: str) -> NumericalError:
    """The one line for logits that are not finite at new token ``token``: the checkpoint,
    the token, and whether its weights are (NaN or inf in a checkpoint of a diverged run)."""
    params = list(s.model.parameters())
    bad = sum(int((~torch.isfinite(p)).sum()) for p in params)
    weights = (f"{bad:,} of its {sum(p.numel() for p in params):,} weights are NaN or inf"
               if bad else "its weights are finite (the activations overflow)")
    return NumericalError(f"numerical error: {s.where}: the model's logits are not finite at "
                          f"token {token} ({where}); {weights}")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocator's out-of-memory error (CUDA's ``OutOfMemoryError``, the
    CPU allocator's ``RuntimeError``, Python's ``MemoryError``)."""
    if isinstance(e, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("can't allocate memory", "not enough memory", "out of memory"))


def run(gc: GenerateConfig, *, stdin: TextIO | None = None, out: TextIO | None = None,
        err: TextIO | None = None) -> None:
    """``blocklab-generate``: answer every prompt of ``gc`` from its checkpoint."""
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    if gc.prompt_file is not None:
        prompt_file(gc.prompt_file)  # a missing file is refused before the model is read
    if gc.threads is not None:
        torch.set_num_threads(gc.threads)
    s = load_sampler(gc.ckpt, gc.device)
    if gc.chat and (s.token_space or s.chat_template is None):
        raise ConfigError(f"config error: chat=true: {s.where} has no chat template (imported "
                          "Hugging Face models keep theirs; a blocklab run has none); drop chat")
    if s.token_space:
        err.write("note: token-space run (synthetic vocabulary): no text; prompts and samples "
                  "are token names (<bos> <sep> ..., f<i> filler, k<i> keys, v<i> values) or "
                  "ids\n")
    generator = torch.Generator(device=s.device)
    if gc.seed is None:
        err.write(f"seed={generator.seed()} (seed=null: pass it as seed= to repeat these)\n")
    else:
        generator.manual_seed(gc.seed)
    stream = Stream(out)
    try:
        for key, text in read_prompts(gc, stdin, err):
            answer(s, key, text, gc, generator, stream, err)
    except KeyboardInterrupt:
        stream.write("\n")
        err.write("interrupted\n")
        raise SystemExit(INTERRUPTED) from None
