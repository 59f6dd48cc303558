"""``probes.babilong.export``: the probe's exact items as a dataset. The JSON lines round-trip
to the same items (the prompt text tokenizes to the item's prompt, every label jointly to its
candidate, the stated token counts are the item's), the per-task files hold their task's and
length's items, ``export_only`` writes the dataset and scores nothing, and the lm-eval task
files load in lm-evaluation-harness (offline, local JSON) with the same prompt, choices,
target and BABILong's rule as the probe."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from blocklab.config import (
    BabilongProbeConfig,
    LitmProbeConfig,
    NeedleProbeConfig,
    PerplexityProbeConfig,
    ProbeSpec,
)
from blocklab.config.schema import TextProbeConfig
from blocklab.data.babilong import answer_correct
from blocklab.data.synthetic import BOS
from blocklab.data.tokenizer import byte_tokenizer
from blocklab.eval.kinds.babilong import Babilong
from blocklab.eval.textspace import TextBuilder, TextTokenizer


def spec(folder, **kw) -> ProbeSpec:
    p = BabilongProbeConfig(enabled=True, n=2, lengths=[2.0, 4.0], tasks=["qa1", "qa2"],
                            depths=[[0.0, 1.0], [0.5, 1.0]], export=str(folder))
    return ProbeSpec(space="text", needle=NeedleProbeConfig(enabled=False),
                     litm=LitmProbeConfig(enabled=False),
                     perplexity=PerplexityProbeConfig(enabled=False),
                     babilong=replace(p, **kw), text=TextProbeConfig(haystack="shakespeare"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    tok = TextTokenizer.from_tokenizers(byte_tokenizer(), bos=BOS, name="byte")
    s = spec(folder)
    cells = Babilong.text_cells(s, TextBuilder(tok, s), 512, None)
    return folder, tok, cells


def rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_json_lines_round_trip_to_the_same_items(exported):
    folder, tok, cells = exported
    items = [it for c in cells for it in c.items]
    records = rows(folder / "babilong.jsonl")
    assert len(records) == len(items) == 2 * 2 * 2 * 2
    assert len({r["id"] for r in records}) == len(records)
    for r, it in zip(records, items):
        assert (r["task"], r["length"], r["depth"]) == (it.cell["task"], it.cell["length"],
                                                        [it.cell["depth_lo"],
                                                         it.cell["depth_hi"]])
        assert [BOS] * r["bos"] + tok.encode(r["input"])[0] == it.prompt
        assert r["prompt_tokens"] == len(it.prompt)
        assert r["labels"] == it.labels and r["labels"][r["gold"]] == r["target"] == \
            it.answer_text and r["question"] == it.question
        for label, cand, n in zip(r["labels"], it.candidates, r["label_tokens"]):
            joint = tok.encode(r["input"] + " " + label)[0]
            assert joint[len(it.prompt) - 1:] == cand and len(cand) == n
        assert r["context"] in r["input"] and all(f in r["context"] for f in r["facts"])
        assert r["input"].endswith(r["question"] + " Answer:")
        assert r["tokenizer"] == "byte" and r["fact_depths"] == it.meta["fact_depths"]


def test_each_task_and_length_has_its_items_and_two_task_files(exported):
    folder, _, _ = exported
    every = rows(folder / "babilong.jsonl")
    for task in ("qa1", "qa2"):
        for length in (1024, 2048):
            mine = rows(folder / f"babilong_{task}_{length}.jsonl")
            assert mine == [r for r in every if r["task"] == task and r["length"] == length]
            for kind in ("mc", "gen"):
                assert (folder / f"babilong_{task}_{length}_{kind}.yaml").is_file()
    group = (folder / "babilong.yaml").read_text()
    assert group.startswith("group: babilong\n") and group.count("  - babilong_") == 8


def test_export_only_writes_the_dataset_and_scores_nothing(tmp_path):
    tok = TextTokenizer.from_tokenizers(byte_tokenizer(), bos=BOS, name="byte")
    s = spec(tmp_path / "only", export_only=True, tasks=["qa1"], lengths=[2.0])
    cells = Babilong.text_cells(s, TextBuilder(tok, s), 512, None)
    assert all(not c.items and "exported only" in c.na for c in cells)
    assert len(rows(tmp_path / "only" / "babilong.jsonl")) == 2 * 2


def test_the_exported_rule_is_the_probes_rule(exported):
    folder, _, _ = exported
    space: dict = {}
    exec((folder / "babilong_utils.py").read_text(), space)  # runs without blocklab
    for out in (" The most recent location of Mary is kitchen.", " kitchen or garden", "no"):
        doc = {"target": "kitchen", "question": "Where is Mary?",
               "labels": ["garden", "kitchen", "office"]}
        assert space["process_results"](doc, [out]) == {
            "acc": float(answer_correct(out, "kitchen", "Where is Mary?", doc["labels"]))}


def test_the_task_files_load_in_lm_eval(exported):
    lm_eval_tasks = pytest.importorskip("lm_eval.tasks")
    folder, _, _ = exported
    every = rows(folder / "babilong_qa2_2048.jsonl")
    manager = lm_eval_tasks.TaskManager(include_path=str(folder))
    tasks = lm_eval_tasks.get_task_dict(["babilong_qa2_2048_mc", "babilong_qa2_2048_gen"],
                                        manager)
    mc, gen = tasks["babilong_qa2_2048_mc"], tasks["babilong_qa2_2048_gen"]
    docs = list(mc.test_docs())
    assert len(docs) == len(every) == 4
    for doc, r in zip(docs, every):
        assert mc.doc_to_text(doc) == r["input"] and mc.doc_to_choice(doc) == r["labels"]
        assert mc.doc_to_target(doc) == r["gold"]
        assert gen.doc_to_target(doc) == r["target"]
        right = gen.process_results(doc, [" " + r["target"] + "."])
        assert right == {"acc": 1.0}
        wrong = next(x for x in r["labels"] if x != r["target"])
        assert gen.process_results(doc, [" " + wrong + "."]) == {"acc": 0.0}
