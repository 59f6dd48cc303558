"""The ``listops`` task: nested list operations over digits (ListOps, Nangia & Bowman 2018,
arXiv 1804.06028), as Long Range Arena generates them (Tay et al. 2020, arXiv 2011.04006;
``lra_benchmarks/data/listops.py``), at lengths in the hundreds.

An expression is a tree: a node is a digit 0-9, or an operator over 2 to ``max_args`` nodes
written ``[OP a b … ]``: ``MIN``, ``MAX``, ``MED`` (the median, truncated to an integer:
``int(np.median(args))``, so an even count's median is the floor of the mean of its two middle
values) or ``SM`` (the sum modulo 10). The answer is the digit the root evaluates to (10
classes). Tokens as LRA's: an operator with its opening bracket is one token (``[MAX``), the
closing bracket one, each digit one.

The sequence is ``ANSWER [OP … ]``: the answer slot first (a CLS-like position that an encoder's
masked-LM objective masks and predicts there, so the token that answers must gather the whole
expression; a causal decoder cannot predict a sequence's first token, so this is an encoder
task), optionally ``gap`` blank tokens (``data.listops_gap``: the first filler id) between the
slot and the expression. Ids: the operators and the closing bracket are the first 5 key-range
ids, the digits the first 10 value-range ids (``data.n_keys >= 5``, ``data.n_values >= 10``).
"""

from __future__ import annotations

import random
from typing import Any

from blocklab.config import DataConfig
from blocklab.data.synthetic import Example, Vocab
from blocklab.data.tasks.base import Task

LISTOPS_MAX_DEPTH = 5  # nodes from the root to the deepest digit (LRA: 10)
LISTOPS_MAX_ARGS = 10  # arguments of an operator, at most (LRA's too)
OPERATORS = ("MIN", "MAX", "MED", "SM")  # LRA's OPERATORS (FIRST and LAST unused there too)
VALUE_P = 0.25  # LRA: below max_depth a node is an operator with probability VALUE_P
MAX_TRIES = 100_000  # trees drawn before giving up on a length range

Tree = int | tuple[str, list["Tree"]]  # a digit, or (operator, arguments)


class _TooLong(Exception):
    pass


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: list[int]
          ) -> Tree:
    """LRA's ``generate_tree``, written anew: its distribution, drawn in its order (the node's
    kind, its argument count, its arguments, then its operator). ``budget``: tokens still
    allowed; a tree that outgrows it is abandoned (it would be rejected anyway)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        budget[0] -= 1
        return rng.randrange(10)
    budget[0] -= 2
    args = []
    for _ in range(rng.randint(2, max_args)):
        args.append(_tree(rng, depth + 1, max_depth, max_args, budget))
        if budget[0] < 0:
            raise _TooLong
    return rng.choice(OPERATORS), args


def evaluate(tree: Tree) -> int:
    """The digit ``tree`` evaluates to (LRA's ``to_value``)."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [evaluate(a) for a in args]
    if op == "MIN":
        return min(values)
    if op == "MAX":
        return max(values)
    if op == "SM":
        return sum(values) % 10
    s, n = sorted(values), len(values)  # MED: int(np.median(...)), values >= 0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def words(tree: Tree) -> list[str]:
    """The expression's tokens as strings: ``['[MAX', '4', '[MIN', '2', '3', ']', ']']``."""
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [f"[{op}", *(w for a in args for w in words(a)), "]"]


def token_ids(vocab: Vocab) -> dict[str, int]:
    """Word -> id: the operators and ``]`` are the first key-range ids, digits value-range
    ids."""
    ids = {f"[{op}": vocab.keys[i] for i, op in enumerate(OPERATORS)}
    ids["]"] = vocab.keys[len(OPERATORS)]
    ids.update({str(d): vocab.values[d] for d in range(10)})
    return ids


def draw_tree(rng: random.Random, min_tokens: int, max_tokens: int, *,
              max_depth: int = LISTOPS_MAX_DEPTH, max_args: int = LISTOPS_MAX_ARGS) -> Tree:
    """A tree of ``min_tokens..max_tokens`` tokens (both inclusive), by rejection: LRA's
    trees drawn until one fits (LRA keeps ``min_length < length < max_length``)."""
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"listops: need 1 <= min_tokens <= max_tokens, got {min_tokens}, "
                         f"{max_tokens}")
    for _ in range(MAX_TRIES):
        budget = [max_tokens]
        try:
            tree = _tree(rng, 1, max_depth, max_args, budget)
        except _TooLong:
            continue
        if max_tokens - budget[0] >= min_tokens:
            return tree
    raise ValueError(f"listops: no tree of {min_tokens}..{max_tokens} tokens in {MAX_TRIES} "
                     f"draws at max_depth={max_depth}, max_args={max_args}")


def listops(rng: random.Random, vocab: Vocab, length: int, *, min_length: int | None = None,
            gap: int = 0, max_depth: int = LISTOPS_MAX_DEPTH, max_args: int = LISTOPS_MAX_ARGS,
            seed: int = 0) -> Example:
    """``ANSWER``, ``gap`` blank tokens (the first filler id), then an expression:
    ``min_length..length`` tokens in all (``min_length`` default: half of ``length``, rounded
    up), the answer slot the one target. ``meta``: the answer digit, the expression's words,
    its depth and the root operator."""
    lo = (length + 1) // 2 if min_length is None else min_length
    tree = draw_tree(rng, max(lo - 1 - gap, 1), length - 1 - gap, max_depth=max_depth,
                     max_args=max_args)
    ids = token_ids(vocab)
    expression = words(tree)
    answer = evaluate(tree)
    tokens = [vocab.values[answer], *[vocab.filler[0]] * gap, *(ids[w] for w in expression)]
    return Example(tokens, [True] + [False] * (len(tokens) - 1),
                   {"task": "listops", "answer": answer, "words": expression,
                    "depth": _depth(tree), "root": tree[0] if isinstance(tree, tuple) else None})


def _depth(tree: Tree) -> int:
    return 1 if isinstance(tree, int) else 1 + max(_depth(a) for a in tree[1])


class ListOpsTask(Task):
    name = "listops"
    generate = staticmethod(listops)

    @classmethod
    def draw(cls, cfg: DataConfig, rng: random.Random) -> dict[str, Any]:
        return {"gap": cfg.listops_gap} if cfg.listops_gap else {}
