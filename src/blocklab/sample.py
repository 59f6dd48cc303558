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
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from blocklab import checkpoint as ckpt
from blocklab.config.schema import GenerateConfig
from blocklab.data.synthetic import SPECIALS, Vocab
from blocklab.data.tokenizer import Specials
from blocklab.errors import ConfigError, DataError
from blocklab.faults import maybe_fault
from blocklab.model.generate import generate

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


# ------------------------------------------------------------------------------- prompts


def token_names(vocab: Vocab) -> list[str]:
    """Names of the synthetic vocabulary's ids, in id order."""
    return [*SPECIALS, *(f"f{i}" for i in range(vocab.n_filler)),
            *(f"k{i}" for i in range(vocab.n_keys)), *(f"v{i}" for i in range(vocab.n_values))]


def token_name(vocab: Vocab, token: int) -> str:
    names = token_names(vocab)
    return names[token] if 0 <= token < len(names) else f"#{token}"


def parse_tokens(s: Sampler, text: str, key: str) -> list[int]:
    """A token-space prompt: names or ids, separated by spaces (a special by its name with or
    without the brackets: ``<sep>`` or ``sep``)."""
    names = token_names(s.tokenizer)
    index = {n: i for i, n in enumerate(names)}
    index.update({n.strip("<>"): i for i, n in enumerate(SPECIALS)})  # bos: no shell quoting
    size = s.model.embed.weight.shape[0]
    ids = []
    for item in text.split():
        if item.isdigit() and int(item) < size:
            ids.append(int(item))
        elif item in index:
            ids.append(index[item])
        else:
            v = s.tokenizer
            raise ConfigError(f"config error: {key}={text!r}: {item!r} is not a token of this "
                              f"run's synthetic vocabulary (names {' '.join(SPECIALS)}, "
                              f"f0..f{v.n_filler - 1}, k0..k{v.n_keys - 1}, "
                              f"v0..v{v.n_values - 1}; or ids 0..{size - 1})")
    return ids


def render_chat(template: str, text: str, tokens: dict[str, str], where: str) -> str:
    """``text`` as the user's message in a chat template, with the assistant's turn opened, as
    Hugging Face's ``apply_chat_template(..., add_generation_prompt=True, tokenize=False)``
    renders it; ``tokens`` are the special tokens by name (``bos_token``: ``"<s>"``)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: dt.datetime.now().strftime(fmt))
    try:
        return env.from_string(template).render(
            messages=[{"role": "user", "content": text}], add_generation_prompt=True, **tokens)
    except jinja2.TemplateError as e:
        raise ConfigError(f"config error: chat=true: the chat template of {where} fails "
                          f"({type(e).__name__}: {e})") from None


def encode(s: Sampler, text: str, *, chat: bool, key: str = "prompt") -> list[int]:
    """The ids a prompt gives the model: BOS first where the model's text starts with it (a
    chat template places its own)."""
    if s.token_space:
        ids = parse_tokens(s, text, key)
    elif chat:
        tok = s.tokenizer
        tok.encode_special_tokens = False  # the template's markers are special tokens
        try:
            names = {f"{role}_token": tok.id_to_token(i)
                     for role, i in s.specials.to_dict().items() if i is not None}
            chat_text = render_chat(s.chat_template, text, names, s.where)
            return tok.encode(chat_text, add_special_tokens=False).ids
        finally:
            tok.encode_special_tokens = True
    else:
        ids = s.tokenizer.encode(text, add_special_tokens=False).ids
    if s.text_bos and ids[:1] != [s.specials.bos]:
        ids = [s.specials.bos, *ids]
    if not ids:
        raise ConfigError(f"config error: {key}={text!r}: empty, and this tokenizer starts no "
                          "text with BOS; give a prompt")
    return ids


def read_prompts(gc: GenerateConfig, stdin: TextIO, err: TextIO) -> Iterator[tuple[str, str]]:
    """``(key, text)`` of each prompt, in order."""
    if gc.interactive:
        yield from _stdin_prompts(stdin, err)
    elif gc.prompt_file is not None:
        yield "prompt_file", prompt_file(gc.prompt_file)
    else:
        yield "prompt", gc.prompt or ""


def prompt_file(path: str) -> str:
    """The whole content of ``prompt_file``; a missing, unreadable or empty file refused."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config error: prompt_file={path!r}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"prompt_file {path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config error: prompt_file={path!r}: unreadable "
                          f"({e.strerror or e})") from None
    if not text.strip():  # an empty file is a mistake, not a request to sample from BOS
        raise ConfigError(f"config error: prompt_file={path!r}: empty (no text to continue); "
                          "write a prompt into it, or drop prompt_file to sample from BOS")
    return text


def _stdin_prompts(stdin: TextIO, err: TextIO) -> Iterator[tuple[str, str]]:
    tty = stdin.isatty()
    for n in range(1, sys.maxsize):
        if tty:
            err.write("> ")
            err.flush()
        line = stdin.readline()
        if not line:
            return
        text = line.removesuffix("\n").removesuffix("\r")
        if text.strip():
            yield f"stdin line {n}", text


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
    context = ids
    if s.family == "encoder_decoder":
        limit = getattr(s.model, "max_source_positions", None)
        if limit is not None and len(ids) > limit:
            raise ConfigError(f"config error: prompt: {len(ids)} tokens; the encoder's position "
                              f"table holds model.max_seq_len={limit}")
        kw["source_ids"] = torch.tensor([ids], device=s.device)
        context = [s.specials.bos]

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
    echo = not (gc.chat or gc.interactive)
    t0, total = time.perf_counter(), 0
    for i in range(gc.num_samples):
        if i:
            stream.write("---\n")
        if echo:
            stream.write(text)
        on_token, finish = _printer(s, ids, echo and bool(text.strip()), stream)
        total += len(continue_ids(s, ids, gc, generator, on_token, err))
        stream.write(finish() + "\n")
    seconds = time.perf_counter() - t0
    err.write(f"{key}: {len(ids)} prompt tokens, {total} new tokens in {seconds:.2f} s "
              f"({total / max(seconds, 1e-9):.1f} tokens/s)\n")
    err.flush()


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
