"""``blocklab-generate``'s prompt text as users type it (issue 41): any characters after
``prompt=`` are the prompt (parentheses, quotes, commas, ``=``, brackets, ``${...}``), while
every other key keeps Hydra's grammar; ``\\n`` / ``\\t`` / ``\\\\`` in ``prompt=`` are
escapes; notes come before a sample, never inside its line."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocklab.config import compose
from inprocess import run_cli
from test_generate_cli import WINDOW, _tiny_text_run, reference, sliding_reference

HARD = ["def main(", "print(\"hi\", 'x')", "a, b, c", "x=1=2", "[1, 2]", "{a: 1}", "it's",
        "${oc.env:HOME}", "cost: $5 ${", "\\${x}", "a\\", "a\\\\'b", "~tilde", "null", "1.5",
        "true", "", "é € 😀", "two\nlines", "'", "\"quoted\""]


def _composed_prompt(text: str) -> str | None:
    """What ``prompt=<text>`` composes to, through the command line's rewriting."""
    from blocklab.cli import VERBATIM, verbatim

    (arg,) = verbatim([f"prompt={text}"], VERBATIM["generate"])
    return OmegaConf.to_object(compose("generate", [arg])).prompt


@pytest.mark.parametrize("text", HARD)
def test_any_prompt_text_composes_to_itself(text):
    assert _composed_prompt(text) == text


def test_random_prompt_text_composes_to_itself():
    rng = random.Random(0)
    alphabet = list("\\'\"${}()[],=:@%~*?| \n\tab")
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
        assert _composed_prompt(text) == text


def test_only_the_text_keys_are_rewritten():
    from blocklab.cli import VERBATIM, verbatim

    argv = ["temperature=0", "top_k=null", "data.files=[a,b]", "model/position=rope",
            "+x=1", "~y", "--cfg", "job", "prompt_file=p(1).txt", "my.prompt=a("]
    assert verbatim(argv, VERBATIM["generate"]) == argv
    assert verbatim(["++prompt=a("], ("prompt",)) == ["++prompt='a('"]


def test_escapes_in_a_prompt():
    from blocklab.sample.prompts import unescape

    assert unescape(r"def f():\n\treturn 1") == "def f():\n\treturn 1"
    assert unescape(r"a\\nb") == "a\\nb"  # an escaped backslash: the n stays a letter
    assert unescape(r"\d+ and C:\x") == r"\d+ and C:\x"  # other backslashes as typed


@pytest.fixture(scope="module")
def rotary(tmp_path_factory) -> Path:
    return _tiny_text_run(tmp_path_factory.mktemp("gen"), "llama_tiny")


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> Path:
    return _tiny_text_run(tmp_path_factory.mktemp("gen"), "gpt2_tiny")


def test_a_prompt_with_brackets_quotes_and_commas_generates(rotary, capfd):
    """The user's ``prompt="def main("`` (the shell hands over ``prompt=def main(``) was refused
    as "not a valid override"; so were commas (a sweep), quotes and ``=``."""
    for text in ("def main(", 'f(a, b="x=1")'):
        r = run_cli(capfd, "blocklab-generate", f"ckpt={rotary}", f"prompt={text}",
                    "temperature=0", "max_new_tokens=5", "stop_at_eos=false", "top_k=null")
        assert r.returncode == 0, r.stderr
        assert r.stdout == text + reference(rotary, text, 5, eos=False)[1] + "\n"


def test_backslash_n_in_a_prompt_is_a_newline(rotary, capfd):
    r = run_cli(capfd, "blocklab-generate", f"ckpt={rotary}", r"prompt=the king\nthe",
                "temperature=0", "max_new_tokens=5", "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    text = "the king\nthe"
    assert r.stdout == text + reference(rotary, text, 5, eos=False)[1] + "\n"


def test_the_sliding_note_comes_before_the_sample_on_its_own_line(learned):
    """stdout and stderr on one terminal: the note was written after the echoed prompt, in
    the middle of the sample's line."""
    from blocklab.config.validate import validate_generate
    from blocklab.sample import run

    gc = validate_generate(OmegaConf.to_object(compose("generate", [
        f"ckpt={learned}", "prompt=the king", "temperature=0", f"max_new_tokens={WINDOW}",
        "stop_at_eos=false", "device=cpu"])))
    both = io.StringIO()
    run(gc, out=both, err=both)
    note, rest = both.getvalue().split("\n", 1)
    assert note.startswith("note: the model's position table holds"), both.getvalue()
    sample = "the king" + sliding_reference(learned, "the king", WINDOW, WINDOW) + "\n"
    assert rest.startswith(sample), rest  # whole, right after the note's line
    assert rest[len(sample):].startswith("prompt: ") and "tokens/s" in rest[len(sample):]
