"""blocklab-repro shakespeare_char (issue 23, item 3): the recipe is nanoGPT's CPU recipe field by
field, the measurement is the run's own validation loss, the checks see a leak (validation text
the model trained on, attention that sees the token it predicts), and the quick protocol passes
while each deliberate break fails."""

from __future__ import annotations

import pytest
import torch

from blocklab import registry
from blocklab.repro import experiments as ex
from blocklab.repro import protocol as pr
from blocklab.repro import text as tx
from blocklab.repro.experiments import shakespeare_char as sh


@pytest.fixture
def unregisters_the_break_mixer():
    """The causal-mask break registers its mixer (as a user plugin would): removed afterwards,
    so no other test of this process sees a mixer that ignores the mask."""
    yield
    registry.table("mixer").pop(sh.UNMASKED, None)
    registry._registered.pop(("mixer", sh.UNMASKED), None)


def _config(*extra: str):
    from blocklab.config import compose, validate_train
    from blocklab.train.run import to_train_config

    return validate_train(to_train_config(compose("train", ["experiment=shakespeare_char",
                                                            *extra])))


def test_the_recipe_is_nanogpts_cpu_recipe():
    """nanoGPT's config/train_shakespeare_char.py with the README's CPU overrides (--block_size=64
    --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
    --dropout=0.0) and train.py's defaults (bias=False, weight_decay=0.1, beta1=0.9,
    grad_clip=1.0), field by field, on the plays with a character vocabulary and the last 10%
    validating."""
    tc = _config()
    m, d, o, s, t = tc.model, tc.data, tc.optim, tc.schedule, tc.trainer
    assert (m.family.name, m.block.name, m.norm.name, m.position.name, m.ffn.name,
            m.mixer.name) == ("decoder", "pre", "layernorm", "learned", "gelu_mlp", "softmax")
    assert (m.n_layers, m.n_heads, m.d_model, m.d_ff, m.max_seq_len) == (4, 4, 128, 512, 64)
    assert m.dropout == 0.0 and m.mixer.dropout == 0.0 and m.tie_embeddings
    assert not (m.norm.bias or m.ffn.bias or m.attention.bias)
    assert m.ffn.approximate == "none" and m.init_std == 0.02  # nn.GELU(), N(0, 0.02)
    assert (d.corpus, tc.tokenizer.name.value, d.seq_len, d.batch_size) == (
        "shakespeare", "char", 64, 12)
    assert (d.val_split, d.val_fraction, d.val_batches, d.packing) == ("last", 0.1, 20, True)
    assert (o.name, o.lr, list(o.betas), o.weight_decay, o.grad_clip, o.eps) == (
        "adamw", 1e-3, [0.9, 0.99], 0.1, 1.0, 1e-8)
    assert (s.name, s.warmup_steps, s.min_lr_ratio) == ("cosine", 100, 0.1)
    assert (t.max_steps, t.val_every_steps, t.accumulate, t.precision) == (
        2000, 250, 1, "32-true")


def test_protocols_and_breaks(unregisters_the_break_mixer):
    """Both sizes train the recipe (quick: its first steps, nothing else changed); each break
    changes the arm's training (new runs: listed as training breaks) and still validates."""
    from blocklab.repro.runner import run_key

    for size in pr.SIZES:
        exp = ex.experiment("shakespeare_char", size)
        (arm,) = exp.sizes[size].arms
        assert arm.overrides[0] == "experiment=shakespeare_char"
        assert all(o.startswith("trainer.") for o in arm.overrides[1:])
        assert set(exp.breaks) == exp.training_breaks == {"val-on-train", "causal-mask-ignored"}
        for what, (_, breaker) in exp.breaks.items():
            (bad,) = breaker((arm,))
            assert bad.name == arm.name and run_key(bad, 0) != run_key(arm, 0)
            tc = _config(*bad.overrides[1:])
            if what == "val-on-train":
                assert tc.data.val_files and len(tc.data.val_files) == 42
            else:
                assert tc.model.mixer.name == sh.UNMASKED


def _tiny_model(mixer: str = "softmax"):
    from blocklab.config import AttentionConfig, MixerConfig, ModelConfig, PositionConfig
    from blocklab.model import build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                   max_seq_len=16, position=PositionConfig(name="learned"),
                                   attention=AttentionConfig(bias=False),
                                   mixer=MixerConfig(name=mixer))).eval()


def test_the_unmasked_break_sees_the_future_and_the_recipe_does_not(
        unregisters_the_break_mixer):
    """The defect the break trains with is the one it names: changing the last token changes
    the unmasked model's first prediction, never the causal model's."""
    sh._unmasked(())  # registers the mixer, as applying the break does
    ids = torch.randint(8, 32, (2, 12))
    later = ids.clone()
    later[:, -1] = (later[:, -1] + 1) % 32
    for mixer, leaks in (("softmax", False), (sh.UNMASKED, True)):
        model = _tiny_model(mixer)
        with torch.no_grad():
            diff = (model(ids)[:, :-1] - model(later)[:, :-1]).abs().max()
        assert bool(diff > 1e-4) is leaks, (mixer, float(diff))


def _plays(tmp_path, n: int = 8) -> list[str]:
    """``n`` small 'plays' of random words (no 32-character run recurs by chance)."""
    import random
    import string

    files = []
    for i in range(n):
        rng = random.Random(i)
        f = tmp_path / "plays" / f"play{i}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("\n".join(" ".join("".join(rng.choices(string.ascii_lowercase,
                                                             k=rng.randint(2, 7)))
                                         for _ in range(rng.randint(4, 10)))
                               for _ in range(120)))
        files.append(str(f))
    return files


@pytest.mark.parametrize("packing", [True, False])  # windows read at once; pieces one by one
def test_seen_in_training_tells_a_held_out_tail_from_validation_on_training_text(tmp_path,
                                                                                 packing):
    """The lookup that sees a wrong split: none of a held-out tail's windows, and every window of
    a validation source that is the training files, begins with 32 tokens found in a training
    window."""
    from blocklab.config import DataConfig, DataName, TokenizerConfig, TokenizerName
    from blocklab.data.streams import build_streams

    files = _plays(tmp_path)
    base = dict(name=DataName.text, files=files, seq_len=64, batch_size=2, packing=packing,
                val_fraction=0.1, num_proc=1, cache_dir=str(tmp_path / "cache"))
    char = TokenizerConfig(name=TokenizerName.char)
    for data, expected in ((DataConfig(val_split="last", **base), "none"),
                           (DataConfig(val_files=files, **base), "all")):
        run = tx.TextRun(model=None, streams=build_streams(data, char), objective=None,
                         consumed=0)
        hits, trials = tx.seen_in_training(run, samples=64)
        picked = min(64, run.streams.val_examples)  # pieces: one under 32 tokens is no trial
        assert (trials == picked if packing else picked - 3 <= trials <= picked) and trials > 10
        assert (run.streams.train_rows is not None) is packing
        assert hits == (0 if expected == "none" else trials), (expected, hits, trials)


@pytest.mark.slow
def test_the_measured_loss_is_the_runs_own_validation_loss(tmp_path, capfd):
    """val loss over the run's first data.val_batches batches of validation windows equals the
    val/loss the run logged at its last step (same streams, same objective)."""
    import csv

    from inprocess import run_cli

    files = _plays(tmp_path)
    run_dir = tmp_path / "run"
    r = run_cli(capfd, "blocklab-train", "experiment=shakespeare_char", "data=text_files",
                f"data.files=[{','.join(files)}]", "data.num_proc=1",
                f"data.cache_dir={tmp_path / 'cache'}", "model.n_layers=1", "model.d_model=32",
                "model.n_heads=2", "model.d_ff=64", "data.val_batches=3", "trainer.max_steps=6",
                "trainer.val_every_steps=6", "trainer.ckpt_every_steps=6",
                "trainer.progress_bar=false", "logger=csv", f"run_dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for p in run_dir.glob("logs/version_*/metrics.csv")
            for row in csv.DictReader(p.open()) if row.get("val/loss")]
    logged = float(rows[-1]["val/loss"])
    run = tx.load_text(run_dir)
    assert run.consumed == 6 * 12
    measured = tx.mean_loss(run, run.streams.val, range(3 * 12), batch_size=12)
    assert measured == pytest.approx(logged, rel=1e-5)


@pytest.mark.slow
def test_quick_protocol_passes_and_each_break_fails(tmp_path, monkeypatch,
                                                    unregisters_the_break_mixer):
    """The CI size on the installed plays: the recipe's validation loss lies in its measured
    interval and its validation text is not training text; validation on the training text and
    attention without the causal mask each make a check fail (each trains a run of its own)."""
    from blocklab.repro.runner import run

    monkeypatch.setenv("BLOCKLAB_DATA_CACHE", str(tmp_path / "cache"))
    exp = ex.experiment("shakespeare_char", "quick")
    good = run(exp, size="quick", seeds=None, root=tmp_path, log=lambda s: None)
    assert good.passed, "; ".join(f"{r['expected']}: {r['observed']}" for r in good.rows
                                  if not r["passed"])
    assert good.trained == 1
    missed = {}
    for what in exp.breaks:
        bad = run(exp, size="quick", seeds=None, root=tmp_path, broken=what, log=lambda s: None)
        assert bad.trained == 1 and not bad.passed, f"--break {what} still passes"
        missed[what] = [r["expected"] for r in bad.rows if not r["passed"]]
    assert any("seen in training" in e for e in missed["val-on-train"]), missed
    assert any(sh.LEAK in e for e in missed["causal-mask-ignored"]), missed
