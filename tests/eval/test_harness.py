"""blocklab inside lm-evaluation-harness, offline: local YAML tasks over a local JSON file.

- lm-eval's multiple-choice log-likelihoods with ``--model blocklab`` equal an independent
  computation (the context/continuation split written here, one plain forward per request,
  log_softmax and a gather) for every decoder mixer (softmax, sliding window, linear, SSM,
  gated convolution, a hybrid stack, a segment-mode memory model: lm-eval's own requests
  through the registered model) and the encoder–decoder
  (its own forward on source and target); the rolling log-likelihood equals non-overlapping
  windows after BOS; ``generate_until`` equals ``blocklab.model.generate`` on each prompt alone.
  Negative control: an off-by-one context/continuation split is caught by the same check.
- A trained checkpoint by name (``model="blocklab"``, ``model_args="ckpt=..."``, as lm-eval's
  command line asks for it once ``blocklab`` is registered) equals ``--model hf`` on its
  ``blocklab-export`` within ``TOL``; ``blocklab-eval harness=[...]`` writes the harness's
  results beside the probe reports. (``blocklab-harness``, lm-eval's own command line, runs in
  docs/evaluation.md's recipe.)
- The encoder family is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from omegaconf import OmegaConf  # noqa: E402

from blocklab.config import ConfigError, compose  # noqa: E402
from blocklab.data.tokenizer import BOS, EOS, byte_tokenizer  # noqa: E402
from blocklab.eval.harness import HarnessModel, lm_class  # noqa: E402
from blocklab.model import build_model  # noqa: E402
from inprocess import run_cli  # noqa: E402

TOL = 2e-4  # float32 log-likelihood sums: a KV-cached / batched read vs one plain forward
DOCS = [
    {"question": "The king said", "choices": [" hello", " goodbye my lord", " yes"], "gold": 0,
     "text": "To be or not to be, that is the question: whether 'tis nobler in the mind."},
    {"question": "My lord, ", "choices": ["I am here", "you", "we shall go"], "gold": 1,
     "text": "Now is the winter of our discontent."},
    {"question": "Speak", "choices": [" now", " never"], "gold": 1,
     "text": "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar."},
]
TASKS = {
    "bl_choice": {"output_type": "multiple_choice", "doc_to_text": "{{question}}",
                  "doc_to_target": "{{gold}}", "doc_to_choice": "{{choices}}",
                  "target_delimiter": "", "metric_list": [{"metric": "acc"}]},
    "bl_rolling": {"output_type": "loglikelihood_rolling", "doc_to_text": "",
                   "doc_to_target": "{{text}}", "metric_list": [{"metric": "word_perplexity"}]},
    "bl_generate": {"output_type": "generate_until", "doc_to_text": "{{question}}",
                    "doc_to_target": "{{choices[gold]}}",
                    "generation_kwargs": {"until": ["e"], "max_gen_toks": 6, "do_sample": False},
                    "metric_list": [{"metric": "exact_match"}]},
}
MIXERS = {
    "softmax": [],
    "window": ["model.mixer.window=3"],
    "linear": ["model/mixer=linear", "model/position=none"],
    "ssm": ["model/mixer=ssm", "model/position=none"],
    "conv": ["model/mixer=gated_conv", "model/position=none"],
    "hybrid": ["model/mixer=ssm", "model.n_layers=2", "model.mixer.pattern=[ssm,softmax]"],
    # read segment by segment (8 tokens) with every earlier token kept: exact
    "segments": ["data.segment_mode=split", "data.seq_len=8", "model.mixer.mem_len=null"],
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A directory of lm-eval task YAMLs over one local JSON-lines file."""
    d = tmp_path_factory.mktemp("tasks")
    (d / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    for name, cfg in TASKS.items():
        (d / f"{name}.yaml").write_text(json.dumps({
            "task": name, "dataset_path": "json", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(d / "docs.jsonl")}}, **cfg}))
    return d


def _model(*overrides: str, preset: str = "llama_tiny") -> HarnessModel:
    """A randomly initialised tiny model with blocklab's byte tokenizer."""
    tok = byte_tokenizer()
    tc = OmegaConf.to_object(compose("train", [
        f"model={preset}", "model.n_layers=1", "model.d_model=32", "model.n_heads=4",
        "model.d_ff=64", "tokenizer=byte", "data=text_files", "data.seq_len=24", *overrides]))
    tc = dataclasses.replace(tc, model=dataclasses.replace(tc.model,
                                                            vocab_size=tok.get_vocab_size()))
    torch.manual_seed(0)
    return HarnessModel(build_model(tc.model).eval(), {"tokenizer": tok.to_str()}, tc,
                        batch_size=4)


def _evaluate(hm: HarnessModel, tasks_dir, names: list[str]) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=lm_class()(model=hm), tasks=names, log_samples=True, bootstrap_iters=0,
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False))


def _ids(text: str) -> list[int]:
    return byte_tokenizer().encode(text, add_special_tokens=False).ids


def _split(context: str, continuation: str, shift: int = 0) -> tuple[list[int], list[int]]:
    """HFLM's split, written out: trailing spaces to the continuation, the whole encoded and
    the continuation its tail past the context's encoding (``shift``: a broken split)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = _ids(context + continuation), _ids(context)
    cut = len(ctx) - shift
    return [BOS, *whole[:cut]], whole[cut:]


@torch.no_grad()
def _reference(hm: HarnessModel, context: str, continuation: str, shift: int = 0) -> float:
    """One plain forward over the whole request; log_softmax; the continuation's sum."""
    ctx, cont = _split(context, continuation, shift)
    if hm.family == "encoder_decoder":
        src = torch.tensor([_ids(context.rstrip())])
        tgt = torch.tensor([[BOS, *cont[:-1]]])
        lp = hm.model(src, tgt).float().log_softmax(-1)[0]
    else:
        ids = torch.tensor([ctx + cont])
        lp = hm.model(ids[:, :-1]).float().log_softmax(-1)[0, -len(cont):]
    return float(lp.gather(-1, torch.tensor(cont)[:, None]).sum())


def _mismatches(hm: HarnessModel, samples: list[dict], shift: int = 0) -> list[str]:
    bad = []
    for s in samples:
        for (context, continuation), resp in zip(s["arguments"], s["resps"]):
            want, got = _reference(hm, context, continuation, shift), resp[0][0]
            if abs(want - got) > TOL:
                bad.append(f"{context!r}+{continuation!r}: harness {got:.5f}, reference "
                           f"{want:.5f}")
    return bad


@pytest.fixture(scope="module")
def choice_samples(tasks) -> tuple[HarnessModel, list[dict]]:
    """lm-eval's multiple-choice task on the softmax model: its logged samples."""
    hm = _model(*MIXERS["softmax"])
    res = _evaluate(hm, tasks, ["bl_choice"])
    assert "acc,none" in res["results"]["bl_choice"]
    return hm, res["samples"]["bl_choice"]


def test_harness_loglikelihoods_equal_a_plain_forward(choice_samples):
    hm, samples = choice_samples
    assert len(samples) == len(DOCS)
    assert not _mismatches(hm, samples)
    # negative control: a split one token off is caught
    assert len(_mismatches(hm, samples, shift=1)) == sum(len(d["choices"]) for d in DOCS)


@pytest.mark.parametrize("mixer", [m for m in MIXERS if m != "softmax"])
def test_every_mixer_answers_the_harness_requests_as_a_plain_forward(mixer, choice_samples):
    """The requests lm-eval made above, through the registered lm-eval model of each mixer."""
    from types import SimpleNamespace

    hm = _model(*MIXERS[mixer])
    lm = lm_class()(model=hm)
    samples = []
    for s in choice_samples[1]:
        got = lm.loglikelihood([SimpleNamespace(args=a) for a in s["arguments"]])
        samples.append({"arguments": s["arguments"], "resps": [[r] for r in got]})
    assert not _mismatches(hm, samples)
    if mixer == "segments":  # perplexity: the whole text read segment by segment (8 tokens)
        assert hm.window is None
        ids = torch.tensor([[BOS, *_ids(DOCS[0]["text"])]])
        with torch.no_grad():
            lp = hm.model(ids[:, :-1]).log_softmax(-1)[0].gather(-1, ids[0, 1:, None]).sum()
        got = lm.loglikelihood_rolling([SimpleNamespace(args=(DOCS[0]["text"],))])
        assert got[0] == pytest.approx(float(lp), abs=TOL)


def test_rolling_and_generation_equal_blocklab_reading(tasks):
    from blocklab.model.generate import generate

    hm = _model("model/position=learned", "model.max_seq_len=20")
    assert hm.window == 20  # the training length (24) cut to the learned table (20)
    res = _evaluate(hm, tasks, ["bl_rolling", "bl_generate"])
    for s in res["samples"]["bl_rolling"]:
        tokens = _ids(s["doc"]["text"])
        want = 0.0
        for a in range(0, len(tokens), 20):  # windows of 20 predicted tokens after BOS
            ids = torch.tensor([[BOS, *tokens[a:a + 20]]])
            with torch.no_grad():
                lp = hm.model(ids[:, :-1]).log_softmax(-1)
            want += float(lp[0].gather(-1, ids[0, 1:, None]).sum())
        assert len(tokens) > 40 or s["doc"]["text"].startswith("Now")
        assert s["resps"][0][0] == pytest.approx(want, abs=TOL)
    # a request longer than the learned table (20) is cut from the left, as lm-eval's hf does
    context = "Now is the winter of our discontent made glorious"
    ctx, cont = _split(context, " summer")
    ids = torch.tensor([(ctx + cont)[-21:]])
    with torch.no_grad():
        lp = hm.model(ids[:, :-1]).log_softmax(-1)[0, -len(cont):]
    want = float(lp.gather(-1, torch.tensor(cont)[:, None]).sum())
    assert hm.loglikelihood([(context, " summer")])[0][0] == pytest.approx(want, abs=TOL)
    for s in res["samples"]["bl_generate"]:
        prompt = torch.tensor([[BOS, *_ids(s["arguments"][0][0])]])
        out = generate(hm.model, prompt, max_new_tokens=6, eos_id=EOS)[0].tolist()
        out = out[: out.index(EOS)] if EOS in out else out
        text = byte_tokenizer().decode(out, skip_special_tokens=True).split("e")[0]
        assert s["resps"][0][0] == text


def test_encoder_decoder_scores_its_target_and_the_encoder_is_refused(tasks):
    hm = _model("model.family.n_encoder_layers=1", preset="t5_tiny")
    res = _evaluate(hm, tasks, ["bl_choice"])
    assert not _mismatches(hm, res["samples"]["bl_choice"])
    with pytest.raises(ConfigError, match="rolling log-likelihood"):
        hm.loglikelihood_rolling(["text"])
    with pytest.raises(ConfigError) as e:
        _model(preset="bert_tiny")
    assert str(e.value).startswith("config error: model.family.name='encoder': ")
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step byte-level GPT-2-style run (HF-exportable) and its blocklab-export."""
    from blocklab.convert import export_model
    from blocklab.train.run import train

    tmp = tmp_path_factory.mktemp("trained")
    (tmp / "train.txt").write_text("\n".join(d["text"] for d in DOCS * 20))
    run = tmp / "run"
    train(compose("train", [
        "experiment=smoke", "data=text_files", "model=gpt2_tiny", "model.n_layers=1",
        "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.max_seq_len=64",
        "data.seq_len=32", "data.batch_size=4", "data.val_batches=1", "data.num_proc=1",
        f"data.files=[{tmp / 'train.txt'}]", "data.documents=line", "tokenizer=byte",
        f"data.cache_dir={tmp / 'cache'}", "trainer.max_steps=2", "trainer.val_every_steps=2",
        "trainer.ckpt_every_steps=2", "probes=none", "checkpoint_probes.enabled=false",
        f"run_dir={run}"]))
    export_model(run, tmp / "hf")
    return run, tmp / "hf"


def _lls(samples: list[dict]) -> dict[tuple[str, str], float]:
    """(context, continuation) -> log-likelihood; written samples hold the arguments as
    ``{"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}``."""
    out = {}
    for s in samples:
        args = s["arguments"]
        if isinstance(args, dict):
            args = [(a["arg_0"], a["arg_1"]) for a in args.values()]
        for arg, resp in zip(args, s["resps"]):
            out[tuple(arg)] = float(resp[0][0])
    return out


def test_a_checkpoint_by_name_equals_hf_on_its_export(trained, tasks, tmp_path, capfd):
    from lm_eval.tasks import TaskManager

    from blocklab.eval.harness import register

    run, hf = trained
    # by name, as lm-eval's command line does after `register()` (blocklab-harness; the CLI
    # itself runs in docs/evaluation.md's recipe: it indexes lm-eval's every task, seconds)
    register()

    def by_name(model: str, args: str) -> dict:
        return _lls(lm_eval.simple_evaluate(
            model=model, model_args=args, tasks=["bl_choice"], log_samples=True,
            bootstrap_iters=0, device="cpu", batch_size=2,
            task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        )["samples"]["bl_choice"])

    ours = by_name("blocklab", f"ckpt={run},add_bos=false")
    theirs = by_name("hf", f"pretrained={hf},add_bos_token=False")
    assert ours.keys() == theirs.keys() and len(ours) == 8
    assert all(abs(ours[k] - theirs[k]) < TOL for k in ours), (ours, theirs)
    # blocklab-eval harness=[...]: the results beside the probe reports, headline printed
    r = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", f"out={tmp_path / 'e'}",
                "harness=[bl_choice]", f"harness_include={tasks}", "harness_limit=2")
    assert r.returncode == 0, r.stderr[-3000:]
    (saved,) = (tmp_path / "e").glob("harness-*/results.json")
    result = json.loads(saved.read_text())
    assert result["blocklab"]["tasks"] == ["bl_choice"] and "acc,none" in result["results"][
        "bl_choice"]
    assert f"harness results {saved}" in r.stdout and "harness/bl_choice/acc,none" in r.stdout
    bad = run_cli(capfd, "blocklab-eval", f"ckpt={run}", "probes=none", "harness_limit=2")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "config error: harness_limit=2.0: applies to harness=[task,...] tasks, and none is "
        "named")
