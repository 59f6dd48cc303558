"""Probe plots: each writes a real PNG for typical, degenerate and all-N/A inputs, rejects empty
input, and never pulls in matplotlib.pyplot."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from blocklab.eval.aggregate import wilson_interval
from blocklab.eval.kinds.litm import Litm
from blocklab.eval.kinds.needle import Needle
from blocklab.eval.plots import plot_perplexity
from blocklab.plotting import save_png
from inprocess import SAFETY_S

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def niah_png(cells: list[dict], path: Path, *, train_length: int | None,
              title: str = "") -> Path:
    """The needle kind's figure, saved as the report saves it."""
    return save_png(Needle.figures(cells, train_length=train_length, title=title)["niah"], path)


def litm_png(cells: list[dict], path: Path, *, title: str = "") -> Path:
    """The lost-in-the-middle kind's figure, saved as the report saves it."""
    return save_png(Litm.figures(cells, train_length=None, title=title)["litm"], path)


def _acc_cell(probe: str, variant: str, acc: float | None, n: int = 64, **extra) -> dict:
    if acc is None:
        return {"probe": probe, "variant": variant, "n": n, "accuracy": None, "ci_low": None,
                "ci_high": None, "status": "n/a: positions beyond table", **extra}
    lo, hi = wilson_interval(round(acc * n), n)
    return {"probe": probe, "variant": variant, "n": n, "accuracy": acc, "ci_low": lo,
            "ci_high": hi, "status": "ok", **extra}


def _needle_cells(lengths=(512, 1024, 2048), depths=(0.0, 0.5, 1.0),
                  variants=("0 distractors", "2 distractors"), na_length=2048) -> list[dict]:
    cells = []
    for v, variant in enumerate(variants):
        k = 2 * v
        for i, length in enumerate(lengths):
            for j, depth in enumerate(depths):
                acc = None if length == na_length else max(0.0, 1.0 - 0.3 * i - 0.1 * j - 0.1 * v)
                cells.append(_acc_cell("needle", variant, acc, length=length, depth=depth,
                                       copy_any_value=1 / (k + 1), chance=0.01))
    return cells


def _litm_cells() -> list[dict]:
    cells = []
    for m in (8, 16):
        for pos in (0, m // 4, m // 2, 3 * m // 4, m - 1):
            x = pos / (m - 1)
            u = 0.9 - 0.5 * (1 - abs(2 * x - 1)) - (0.1 if m == 16 else 0.0)
            for variant, shift in (("kv_records", 0.0), ("query_aware", 0.05)):
                cells.append(_acc_cell("litm", variant, round(u + shift, 3), n=50, length=1024,
                                       n_records=m, gold_position=pos,
                                       copy_any_value=1 / m, chance=0.001))
        cells.append(_acc_cell("litm", "oracle", 0.97, n=50, n_records=m, chance=0.001))
        cells.append(_acc_cell("litm", "closed_book", 0.02, n=50, n_records=m, chance=0.001))
    return cells


def _ppl_cells() -> list[dict]:
    cells = []
    for variant, slope in (("nonoverlapping", 1.0), ("sliding", 0.8)):
        for i, length in enumerate((256, 512, 1024, 2048, 4096)):
            ppl = None if (variant == "sliding" and length == 4096) else 20.0 * (1 + slope * i**2)
            cells.append({"probe": "perplexity", "variant": variant, "length": length,
                          "ppl": ppl, "nll": None if ppl is None else 3.0 + i,
                          "status": "ok" if ppl is not None else "n/a: too long"})
    return cells


def _assert_png(path: Path, min_bytes: int = 5_000) -> None:
    assert path.is_file()
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes


def test_plot_niah_writes_png(tmp_path):
    cells = _needle_cells() + _litm_cells()  # other probes are ignored
    out = niah_png(cells, tmp_path / "sub" / "niah.png", train_length=1024, title="NIAH test")
    assert out == tmp_path / "sub" / "niah.png"
    _assert_png(out)


@pytest.mark.parametrize("train_length", [None, 768, 8192])
def test_plot_niah_train_length_between_outside_or_absent(tmp_path, train_length):
    _assert_png(niah_png(_needle_cells(), tmp_path / "n.png", train_length=train_length))


def test_plot_niah_degenerate_inputs(tmp_path):
    single = _needle_cells(lengths=(1024,), depths=(0.5,), variants=("x",), na_length=None)
    _assert_png(niah_png(single, tmp_path / "single.png", train_length=1024), 2_000)
    all_na = _needle_cells(lengths=(4096,), na_length=4096)
    _assert_png(niah_png(all_na, tmp_path / "na.png", train_length=1024), 2_000)
    # Missing variant / depth keys, CSV-style strings, a hole in the grid.
    csvish = [{"probe": "needle", "length": "512", "depth": "0.25", "accuracy": "0.5",
               "status": "ok"},
              {"probe": "needle", "length": "1024", "depth": "", "accuracy": "", "status": ""},
              {"probe": "needle", "variant": None, "length": 2048, "depth": 0.75,
               "accuracy": 0.1}]
    _assert_png(niah_png(csvish, tmp_path / "csv.png", train_length=None), 2_000)


def test_plot_litm_writes_png(tmp_path):
    out = litm_png(_litm_cells() + _needle_cells(), tmp_path / "litm.png", title="LITM test")
    _assert_png(out)


def test_plot_litm_degenerate_inputs(tmp_path):
    only_refs = [c for c in _litm_cells() if c["variant"] in ("oracle", "closed_book")]
    _assert_png(litm_png(only_refs, tmp_path / "refs.png"), 2_000)
    one_m = [c for c in _litm_cells() if c.get("n_records") == 8 and c["variant"] == "kv_records"]
    _assert_png(litm_png(one_m, tmp_path / "one.png"), 2_000)
    all_na = [{**c, "accuracy": None, "status": "n/a: too long"} for c in _litm_cells()]
    _assert_png(litm_png(all_na, tmp_path / "na.png"), 2_000)


def test_plot_perplexity_writes_png(tmp_path):
    out = plot_perplexity(_ppl_cells(), tmp_path / "ppl.png", train_length=1024, title="PPL")
    _assert_png(out)


def test_plot_perplexity_degenerate_inputs(tmp_path):
    single = [c for c in _ppl_cells() if c["length"] == 512][:1]
    _assert_png(plot_perplexity(single, tmp_path / "one.png", train_length=None), 2_000)
    all_na = [{**c, "ppl": None} for c in _ppl_cells()]
    _assert_png(plot_perplexity(all_na, tmp_path / "na.png", train_length=1024), 2_000)
    no_variant = [{k: v for k, v in c.items() if k != "variant"} for c in _ppl_cells()[:3]]
    _assert_png(plot_perplexity(no_variant, tmp_path / "nv.png", train_length=100_000), 2_000)


@pytest.mark.parametrize(
    "call",
    [lambda cs, p: niah_png(cs, p, train_length=1024),
     lambda cs, p: litm_png(cs, p),
     lambda cs, p: plot_perplexity(cs, p, train_length=1024)],
    ids=["niah", "litm", "perplexity"],
)
def test_empty_input_raises(tmp_path, call):
    with pytest.raises(ValueError, match="probe"):
        call([], tmp_path / "empty.png")
    with pytest.raises(ValueError, match="probe"):
        call([{"probe": "other", "length": 1024, "accuracy": 0.5}], tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()


def test_wrong_probe_only_raises(tmp_path):
    with pytest.raises(ValueError, match="needle"):
        niah_png(_ppl_cells(), tmp_path / "x.png", train_length=None)
    with pytest.raises(ValueError, match="litm"):
        litm_png(_needle_cells(), tmp_path / "x.png")
    with pytest.raises(ValueError, match="perplexity"):
        plot_perplexity(_litm_cells(), tmp_path / "x.png", train_length=None)


def test_no_pyplot_import(tmp_path):
    """Import and plot in a fresh interpreter: pyplot (global state, GUI backends) stays out,
    and importing the module alone does not load matplotlib at all."""
    out = tmp_path / "fresh.png"
    code = textwrap.dedent(f"""
        import sys
        from blocklab.eval.kinds.needle import Needle
        from blocklab.plotting import save_png
        assert "matplotlib" not in sys.modules, "matplotlib imported at module import"
        cells = [{{"probe": "needle", "variant": "v", "length": L, "depth": d, "accuracy": 0.5}}
                 for L in (256, 512) for d in (0.0, 1.0)]
        save_png(Needle.figures(cells, train_length=256, title="")["niah"], {str(out)!r})
        assert "matplotlib" in sys.modules
        assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=SAFETY_S)
    assert proc.returncode == 0, proc.stderr
    _assert_png(out, 1_000)


# ------------------------------------------------- what each figure draws (before it is saved)
# Each check reads the matplotlib Figure a ``*_figure`` function returns and compares what is
# drawn with the cells; ``test_each_check_fails_on_a_figure_of_wrong_data`` draws each figure
# from tampered cells (accuracies permuted, a value changed) and expects the check to fail.


def _expected_grid(cells: list[dict], row_key: str, rows: list, lengths: list) -> list[list]:
    """accuracy[row][length] as the cells state it (None: N/A)."""
    by = {(c[row_key], c["length"]): c["accuracy"] for c in cells}
    return [[by.get((r, n)) for n in lengths] for r in rows]


def _image_equals(image, expected: list[list]) -> None:
    import numpy as np

    data = image.get_array()
    assert data.shape == (len(expected), len(expected[0]))
    for i, row in enumerate(expected):
        for j, want in enumerate(row):
            if want is None:
                assert np.ma.is_masked(data[i, j]), (i, j)
            else:
                assert not np.ma.is_masked(data[i, j]) and data[i, j] == pytest.approx(want)


def _check_niah(fig, cells: list[dict]) -> None:
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(variants) == 2
    assert fig._suptitle.get_text() == ("Needle in a haystack: accuracy by depth and length\n"
                                        "NIAH test")
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    for ax, variant in zip(panels, variants):
        assert ax.get_title().startswith(variant)
        assert ax.get_ylabel() == "needle depth"
        assert ax.get_xlabel().startswith("context length (tokens)")
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0%", "50%", "100%"]
        vc = [c for c in cells if c["variant"] == variant]
        _image_equals(ax.images[0], _expected_grid(vc, "depth", depths, lengths))


def _check_litm(fig, cells: list[dict]) -> None:
    (ax,) = fig.axes
    assert ax.get_title() == "Lost in the middle: accuracy by gold-record position\nLITM test"
    assert ax.get_xlabel().startswith("relative gold position")
    assert ax.get_ylabel() == "accuracy (Wilson 95% CI)"
    curves = {c.get_label(): c for c in ax.containers}
    assert {label.split(" (")[0] for label in curves} == {
        f"{v}, m={m}" for v in ("kv_records", "query_aware") for m in (8, 16)}
    for label, container in curves.items():
        variant, m = label.split(" (")[0].split(", m=")
        pts = sorted((c["gold_position"], c["accuracy"]) for c in cells
                     if c["variant"] == variant and c["n_records"] == int(m))
        line = container.lines[0]
        assert list(line.get_ydata()) == pytest.approx([a for _, a in pts])
        dx = -0.006 if variant == "kv_records" else 0.006
        assert list(line.get_xdata()) == pytest.approx([p / (int(m) - 1) + dx for p, _ in pts])
    means = {v: sum(c["accuracy"] for c in cells if c["variant"] == v)
             / sum(1 for c in cells if c["variant"] == v) for v in ("oracle", "closed_book")}
    labels = [line.get_label() for line in ax.lines]
    for v, mean in means.items():
        assert f"{v} (mean {mean:.2f})" in labels


def _check_perplexity(fig, cells: list[dict]) -> None:
    import math

    (ax,) = fig.axes
    assert ax.get_title() == "PPL"
    assert ax.get_xlabel() == "context length (tokens, log2 scale)"
    assert ax.get_ylabel() == "perplexity (log scale)"
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith(
        "train length")}
    assert set(lines) == {"nonoverlapping", "sliding"}
    for variant, line in lines.items():
        pts = sorted((c["length"], c["ppl"]) for c in cells if c["variant"] == variant)
        assert list(line.get_xdata()) == [n for n, _ in pts]
        got = list(line.get_ydata())
        for g, (_, want) in zip(got, pts, strict=True):
            assert math.isnan(g) if want is None else g == pytest.approx(want)


def _hops_cells() -> list[dict]:
    cells = []
    for h in (1, 2, 4):
        for i, length in enumerate((64, 128)):
            acc = None if (h, length) == (4, 128) else round(0.9 - 0.2 * i - 0.1 * h, 3)
            cells.append(_acc_cell("hops", f"{h} hops", acc, hops=h, length=length,
                                   copy_any_value=0.5, chance=0.01))
    return cells


def _check_hops(fig, cells: list[dict]) -> None:
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 1
    (ax,) = panels
    assert ax.get_title().startswith("Variable tracking: accuracy by hops and length")
    assert ax.get_ylabel() == "hops (assignments in the chain)"
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["1", "2", "4"]
    _image_equals(ax.images[0], _expected_grid(cells, "hops", [1, 2, 4], [64, 128]))


def _figures():
    from blocklab.eval.kinds.hops import Hops
    from blocklab.eval.plots import perplexity_figure

    return {
        "niah": (_needle_cells,
                 lambda cs: Needle.figures(cs, train_length=1024, title="NIAH test")["niah"],
                 _check_niah),
        "litm": (_litm_cells,
                 lambda cs: Litm.figures(cs, train_length=None, title="LITM test")["litm"],
                 _check_litm),
        "perplexity": (_ppl_cells, lambda cs: perplexity_figure(cs, train_length=1024,
                                                                title="PPL"), _check_perplexity),
        "hops": (_hops_cells, lambda cs: Hops.figures(cs, train_length=64, title="")["hops"],
                 _check_hops),
    }


@pytest.mark.parametrize("name", ["niah", "litm", "perplexity", "hops"])
def test_each_figure_draws_its_cells(name):
    make_cells, draw, check = _figures()[name]
    cells = make_cells()
    fig = draw(cells)
    check(fig, cells)  # asserts the drawn data; test_each_check_fails_on_a_figure_of_wrong_data
    assert fig.axes and cells


def _tampered(cells: list[dict]) -> list[dict]:
    """The same cells with their numbers moved: accuracies (or perplexities) rotated by one
    among the cells that have one, so every position keeps a value but not its own."""
    key = "ppl" if any("ppl" in c for c in cells) else "accuracy"
    have = [i for i, c in enumerate(cells) if c.get(key) is not None]
    values = [cells[i][key] for i in have]
    out = [dict(c) for c in cells]
    for i, v in zip(have, values[1:] + values[:1]):
        out[i][key] = v * 1.5 + 0.01 if v == values[0] else v  # rotated, and one changed
    return out


@pytest.mark.parametrize("name", ["niah", "litm", "perplexity", "hops"])
def test_each_check_fails_on_a_figure_of_wrong_data(name):
    """The negative control of the test above: the figure of tampered cells fails the check
    against the true cells (so the check reads the drawn data, not just the labels)."""
    make_cells, draw, check = _figures()[name]
    cells = make_cells()
    with pytest.raises(AssertionError):
        check(draw(_tampered(cells)), cells)
