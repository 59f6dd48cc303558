"""Every recipe of the README and docs/*.md runs (tests/docs_recipes.py says how a page marks
what cannot run here, and why); a broken recipe fails the run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from docs_recipes import (
    ROOT,
    RecipeFailed,
    blocks,
    compare_in_process,
    pages,
    problems,
    run_page,
)
from inprocess import SAFETY_S, TOOLS, run_cli


def _runner(capfd):
    def run(tool: str, args: list[str], env: dict[str, str], cwd: Path
            ) -> subprocess.CompletedProcess:
        if tool in TOOLS:
            return run_cli(capfd, tool, *args, cwd=cwd, env=env)
        if tool == "blocklab-compare":
            return compare_in_process(args, cwd)
        return subprocess.run([str(ROOT / ".venv" / "bin" / tool), *args], cwd=cwd, env=None,
                              capture_output=True, text=True, timeout=SAFETY_S)
    return run


def test_every_skipped_recipe_says_why() -> None:
    bad = [p for page in pages() for p in problems(page)]
    assert not bad, "\n".join(bad)


def test_the_readme_begins_with_its_two_commands() -> None:
    first = blocks(ROOT / "README.md")[0]
    assert first.lang == "bash" and [c.split(" #")[0].strip() for c, _ in first.commands] == [
        "bash scripts/setup.sh && .venv/bin/blocklab-train",
        "bash scripts/test.sh"]  # .ci/run runs the second
    assert first.norun  # the main job and the whole suite are not run from inside the suite


@pytest.mark.slow
@pytest.mark.parametrize("page", [p.name for p in pages()])
def test_the_recipes_of_a_page_run(page, tmp_path, capfd) -> None:
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    start = time.perf_counter()
    timings: list[str] = []
    ran = run_page(path, tmp_path / "page", _runner(capfd), log=timings.append)  # raises on a miss
    assert ran == len(timings)  # every recipe ran and was timed (a page may have none)
    with capfd.disabled():  # shown with -s: what each recipe costs
        print("\n".join(timings), f"\n{page}: {ran} recipe(s) in "
              f"{time.perf_counter() - start:.1f} s")


BROKEN = """# a page

```bash
.venv/bin/blocklab-estimate model.n_layer=3
```
"""


def test_a_recipe_with_a_made_up_key_fails(tmp_path, capfd) -> None:
    page = tmp_path / "broken.md"
    with pytest.raises(RecipeFailed, match=r"model\.n_layer"):
        run_page(page, tmp_path / "page", _runner(capfd), text=BROKEN, log=lambda line: None)


def test_a_promised_exit_code_is_checked(tmp_path, capfd) -> None:
    ok = BROKEN.replace("n_layer=3", "n_layer=3   # refused (exit 2)")
    assert run_page(tmp_path / "p.md", tmp_path / "page", _runner(capfd), text=ok,
                    log=lambda line: None) == 1
    wrong = BROKEN.replace("n_layer=3", "n_layer=3   # refused (exit 3)")
    with pytest.raises(RecipeFailed, match="exited 2, expected 3"):
        run_page(tmp_path / "p.md", tmp_path / "page", _runner(capfd), text=wrong,
                 log=lambda line: None)


def test_a_skip_without_a_reason_is_caught(tmp_path) -> None:
    text = ("<!-- norun: -->\n```bash\nblocklab-train\n```\n\n```console\nblocklab-train\n```\n"
            "<!-- norun: stray -->\n\ntext\n```sh\nls\n```\n")
    bad = problems(tmp_path / "p.md", text)
    assert len(bad) == 4, bad
    assert any("without a reason" in b for b in bad)
    assert any("console" in b for b in bad)
    assert any("before no block" in b for b in bad)
    assert any("'sh'" in b for b in bad)
