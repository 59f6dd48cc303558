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
from blocklab.eval.kinds.litm import plot_litm
from blocklab.eval.kinds.needle import plot_niah
from blocklab.eval.plots import plot_perplexity

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
    out = plot_niah(cells, tmp_path / "sub" / "niah.png", train_length=1024, title="NIAH test")
    assert out == tmp_path / "sub" / "niah.png"
    _assert_png(out)


@pytest.mark.parametrize("train_length", [None, 768, 8192])
def test_plot_niah_train_length_between_outside_or_absent(tmp_path, train_length):
    _assert_png(plot_niah(_needle_cells(), tmp_path / "n.png", train_length=train_length))


def test_plot_niah_degenerate_inputs(tmp_path):
    single = _needle_cells(lengths=(1024,), depths=(0.5,), variants=("x",), na_length=None)
    _assert_png(plot_niah(single, tmp_path / "single.png", train_length=1024), 2_000)
    all_na = _needle_cells(lengths=(4096,), na_length=4096)
    _assert_png(plot_niah(all_na, tmp_path / "na.png", train_length=1024), 2_000)
    # Missing variant / depth keys, CSV-style strings, a hole in the grid.
    csvish = [{"probe": "needle", "length": "512", "depth": "0.25", "accuracy": "0.5",
               "status": "ok"},
              {"probe": "needle", "length": "1024", "depth": "", "accuracy": "", "status": ""},
              {"probe": "needle", "variant": None, "length": 2048, "depth": 0.75,
               "accuracy": 0.1}]
    _assert_png(plot_niah(csvish, tmp_path / "csv.png", train_length=None), 2_000)


def test_plot_litm_writes_png(tmp_path):
    out = plot_litm(_litm_cells() + _needle_cells(), tmp_path / "litm.png", title="LITM test")
    _assert_png(out)


def test_plot_litm_degenerate_inputs(tmp_path):
    only_refs = [c for c in _litm_cells() if c["variant"] in ("oracle", "closed_book")]
    _assert_png(plot_litm(only_refs, tmp_path / "refs.png"), 2_000)
    one_m = [c for c in _litm_cells() if c.get("n_records") == 8 and c["variant"] == "kv_records"]
    _assert_png(plot_litm(one_m, tmp_path / "one.png"), 2_000)
    all_na = [{**c, "accuracy": None, "status": "n/a: too long"} for c in _litm_cells()]
    _assert_png(plot_litm(all_na, tmp_path / "na.png"), 2_000)


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
    [lambda cs, p: plot_niah(cs, p, train_length=1024),
     lambda cs, p: plot_litm(cs, p),
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
        plot_niah(_ppl_cells(), tmp_path / "x.png", train_length=None)
    with pytest.raises(ValueError, match="litm"):
        plot_litm(_needle_cells(), tmp_path / "x.png")
    with pytest.raises(ValueError, match="perplexity"):
        plot_perplexity(_litm_cells(), tmp_path / "x.png", train_length=None)


def test_no_pyplot_import(tmp_path):
    """Import and plot in a fresh interpreter: pyplot (global state, GUI backends) stays out,
    and importing the module alone does not load matplotlib at all."""
    out = tmp_path / "fresh.png"
    code = textwrap.dedent(f"""
        import sys
        import blocklab.eval.kinds.needle as plots
        assert "matplotlib" not in sys.modules, "matplotlib imported at module import"
        cells = [{{"probe": "needle", "variant": "v", "length": L, "depth": d, "accuracy": 0.5}}
                 for L in (256, 512) for d in (0.0, 1.0)]
        plots.plot_niah(cells, {str(out)!r}, train_length=256)
        assert "matplotlib" in sys.modules
        assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    _assert_png(out, 1_000)
