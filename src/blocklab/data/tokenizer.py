"""Tokenizers saved with every run, and the special ids every part of blocklab uses.

Three kinds: the synthetic task vocabulary, a tokenizer blocklab builds (a byte-level BPE
trained on a sample of the corpus, raw bytes, or the characters seen in the corpus: its
specials sit at ids 0..6 like the synthetic vocabulary's), and a tokenizer the user already has (``tokenizer=file``: a
``tokenizer.json``, or a Hugging Face tokenizer directory). A user's tokenizer keeps its *own*
special ids: :class:`Specials` says which ids pad, begin and end documents and mask, read from
the directory's ``special_tokens_map.json`` / ``tokenizer_config.json`` or found by their usual
names; one that is missing is added at the end of the vocabulary, and reported. The specials
travel with the tokenizer into collators, objectives, probes and checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blocklab.config import ConfigError, TokenizerConfig
from blocklab.data.synthetic import BOS, EOS, MASK, PAD, SPECIALS, Vocab


@dataclass(frozen=True)
class Specials:
    """The ids of the special tokens a run uses (``mask`` only matters for encoders)."""

    pad: int = PAD
    bos: int = BOS
    eos: int = EOS
    mask: int | None = MASK

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Specials:
        """From a checkpoint's metadata; older checkpoints (none stored) used blocklab's ids."""
        return cls(**d) if d else cls()


#: blocklab's own vocabularies (synthetic, bpe, byte): specials at ids 0..6.
BLOCKLAB_SPECIALS = Specials()

# Usual names of each special in tokenizers people already have, most specific first.
_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<|finetune_right_pad_id|>"),
    "bos": ("<bos>", "<s>", "[CLS]", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("<eos>", "</s>", "[SEP]", "<|end_of_text|>", "<|endoftext|>", "<|eot_id|>"),
    "mask": ("<mask>", "[MASK]", "<|mask|>"),
}
_ADDED = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "mask": "<mask>"}


def tokenizer_from_json(text: str) -> Any:
    """A tokenizer from its saved JSON: a :class:`Vocab` for synthetic tasks, else a
    ``tokenizers.Tokenizer``."""
    spec = json.loads(text)
    if spec.get("kind") == "synthetic":
        return Vocab(n_filler=spec["n_filler"], n_keys=spec["n_keys"], n_values=spec["n_values"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    tok.encode_special_tokens = True  # not serialized: text naming a special stays text
    return tok


def byte_tokenizer() -> Any:
    """Raw UTF-8 bytes (byte-level alphabet) after blocklab's specials."""
    from tokenizers import Tokenizer, models

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(sorted(_alphabet()))})
    return _byte_level(Tokenizer(models.BPE(vocab=vocab, merges=[])), add_specials=True)


UNK = "<unk>"  # the character tokenizer's id for a character its corpus never showed


def char_tokenizer(chars: Iterable[str]) -> Any:
    """One id per character (nanoGPT's shakespeare_char): blocklab's specials at 0..6, ``<unk>``
    at 7, then the characters of ``chars`` in code-point order. A ``tokenizers.Tokenizer`` (a
    word-level model over single characters, decoded by joining), so everything that takes
    the BPE — preparation, offsets, probes, checkpoints — takes it unchanged; a character it
    never saw reads as ``<unk>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {s: i for i, s in enumerate((*SPECIALS, UNK))}
    for ch in sorted(set(chars)):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([*SPECIALS, UNK])
    tok.encode_special_tokens = True
    return tok


LONG_WORD = 512  # BPE training: a longer run without a space (or of spaces) is cut into pieces
HEARTBEAT_S = 30.0  # BPE training without a progress bar: a line this often
_LONG_RUN = re.compile(rf"(?<!\S)\S{{{LONG_WORD + 1},}}|(?<!\s)\s{{{LONG_WORD + 1},}}")


def train_bpe(cfg: TokenizerConfig, documents: Iterable[str], *, progress: bool = False,
              log: Callable[[str], None] | None = None) -> Any:
    """A byte-level BPE of ``cfg.vocab_size`` (blocklab's specials included) trained on the
    given documents, consumed as a stream.

    A run of more than LONG_WORD characters without a space (or of spaces) is cut into pieces
    of at most that for training: the trainer's time grows with the square of a word's length
    (a sample that is one 20 MB "word" ran for hours), and such a run teaches nothing about
    words; the merges learned encode it all the same. ``log`` gets a line when the sample is
    read (saying what was cut) and when training ends, and — without a progress bar
    (``progress``) — one every HEARTBEAT_S seconds while it runs."""
    from tokenizers import Tokenizer, models, trainers

    tok = _byte_level(Tokenizer(models.BPE()), add_specials=False)
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=_alphabet(), show_progress=progress)
    seen = {"chars": 0, "run_chars": 0, "read": False}
    t0 = time.perf_counter()
    texts = _bounded_words(documents, seen, log)
    with _heartbeat(None if progress else log, seen, t0):
        tok.train_from_iterator(_batches(texts), trainer=trainer)
    if log is not None:
        log(f"tokenizer: trained a BPE of {tok.get_vocab_size():,} tokens in "
            f"{time.perf_counter() - t0:.1f} s")
    tok.encode_special_tokens = True
    return tok


def _bounded_words(documents: Iterable[str], seen: dict[str, Any],
                   log: Callable[[str], None] | None) -> Iterator[str]:
    """The documents, with every run of more than LONG_WORD characters without a space (or
    of spaces) cut into pieces (each piece is pre-tokenized on its own); counts to ``seen``."""
    for doc in documents:
        seen["chars"] += len(doc)
        start = 0
        for m in _LONG_RUN.finditer(doc):
            seen["run_chars"] += m.end() - m.start()
            for cut in range(m.start() + LONG_WORD, m.end(), LONG_WORD):
                yield doc[start:cut]
                start = cut
        yield doc[start:] if start else doc
    seen["read"] = True
    if log is not None:
        cut = (f"; {seen['run_chars'] / 1e6:.1f} MB of it in runs of over {LONG_WORD} "
               f"characters without a space, cut into pieces of at most {LONG_WORD} for "
               "training" if seen["run_chars"] else "")
        log(f"tokenizer: sample read ({seen['chars'] / 1e6:.1f} MB){cut}; computing merges ...")


@contextlib.contextmanager
def _heartbeat(log: Callable[[str], None] | None, seen: dict[str, Any], t0: float
               ) -> Iterator[None]:
    """A line to ``log`` every HEARTBEAT_S seconds until the block ends (the trainer
    releases the GIL), so training without a terminal is never silent for long."""
    if log is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            what = ("computing merges" if seen["read"] else
                    f"reading the sample ({seen['chars'] / 1e6:.1f} MB so far)")
            log(f"tokenizer: {what} ... {time.perf_counter() - t0:.0f} s")

    thread = threading.Thread(target=beat, name="bpe-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def load_user_tokenizer(path: str | Path) -> tuple[Any, Specials, list[str]]:
    """``tokenizer=file``: (tokenizer, its special ids, notes on specials that were added)."""
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise ConfigError(f"config error: tokenizer.path={str(path)!r}: no tokenizer.json there")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ConfigError(f"config error: tokenizer.path={str(path)!r}: not a tokenizers JSON "
                          f"file ({str(e).splitlines()[0]})") from None
    fixed = file.parent / "blocklab_specials.json"
    if fixed.is_file():  # written by blocklab (init_from, imports): the ids as they are
        tok.encode_special_tokens = True
        return tok, Specials(**json.loads(fixed.read_text())), []
    found = find_specials(tok, file.parent if p.is_dir() else None)
    missing = [role for role, i in found.items() if i is None]
    notes = []
    if missing:
        tok.add_special_tokens([_ADDED[r] for r in missing])
        for role in missing:
            found[role] = tok.token_to_id(_ADDED[role])
        notes.append("tokenizer: " + ", ".join(f"{_ADDED[r]} added as id {found[r]}"
                                               for r in missing)
                     + f" ({file} names no {'/'.join(missing)} token)")
    tok.encode_special_tokens = True
    return tok, Specials(**found), notes


def find_specials(tok: Any, directory: Path | None) -> dict[str, int | None]:
    """Ids of the pad / bos / eos / mask tokens of ``tok`` (a ``tokenizers.Tokenizer``): the
    ones ``directory`` (a Hugging Face tokenizer directory) declares, else the usual names;
    None where there is none."""
    named = _declared_specials(directory) if directory is not None else {}
    found: dict[str, int | None] = {}
    for role, names in _NAMES.items():
        candidates = ([named[role]] if named.get(role) else []) + list(names)
        found[role] = next((tok.token_to_id(n) for n in candidates
                            if tok.token_to_id(n) is not None), None)
    return found


def _declared_specials(directory: Path) -> dict[str, str]:
    """Special-token strings a Hugging Face tokenizer directory declares."""
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        f = directory / name
        try:
            data = json.loads(f.read_text()) if f.is_file() else {}
        except (OSError, ValueError):
            continue
        for role in _NAMES:
            value = data.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and role not in out:
                out[role] = value
    return out


def _alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel.alphabet()


def _byte_level(tok: Any, *, add_specials: bool) -> Any:
    from tokenizers import decoders, pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if add_specials:
        tok.add_special_tokens(list(SPECIALS))
    tok.encode_special_tokens = True
    return tok


def _batches(documents: Iterable[str], size: int = 256) -> Iterator[list[str]]:
    batch: list[str] = []
    for d in documents:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch

