"""``blocklab-generate``'s prompts: where they come from (``prompt=``, ``prompt_file=``, stdin
one a line), how text becomes ids (BOS where the model's text begins with it; ``chat=true``
through the checkpoint's chat template, rendered in a sandbox) and the names of the synthetic
vocabulary's tokens, for runs that have no text."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from blocklab.config.schema import GenerateConfig
from blocklab.data.synthetic import SPECIALS, Vocab
from blocklab.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.sample import Sampler


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
        yield "prompt", unescape(gc.prompt or "")


#: The escapes ``prompt=`` reads (a shell passes ``\n`` through as two characters); any other
#: backslash stays as typed. A prompt file is read as it is.
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """``prompt=``'s text with ``\\n`` a newline, ``\\t`` a tab and ``\\\\`` one backslash."""
    return re.sub(r"\\([nt\\])", lambda m: ESCAPES[m.group(1)], text)


def prompt_file(path: str) -> str:
    """The whole content of ``prompt_file``; a missing file, a directory, an unreadable, not
    UTF-8 or empty file refused, naming it."""
    p = Path(path)

    def refused(rule: str) -> ConfigError:
        return ConfigError(f"config error: prompt_file={path!r}: {rule}")

    if p.is_dir():
        raise refused("is a directory (a text file is required)")
    if not p.exists():
        raise refused("no such file")
    if not p.is_file():
        raise refused("not a regular file (a text file is required)")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise refused(f"unreadable ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise refused(f"not UTF-8 text (invalid byte 0x{data[e.start]:02x} at offset "
                      f"{e.start}); save it as UTF-8") from None
    if not text.strip():  # an empty file is a mistake, not a request to sample from BOS
        raise refused("empty (no text to continue); write a prompt into it, or drop "
                      "prompt_file to sample from BOS")
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
