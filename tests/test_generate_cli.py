"""``blocklab-generate`` as users run it, against ``blocklab.model.generate.generate`` on the
same checkpoint: greedy output equal to it, EOS stopping by default, seeds reproducing samples
(never the global RNG), a sliding context past a learned position table equal to re-running
the model on the cropped window (a rotary model just continues), tokens streamed to stdout as
they come (a process killed after its N-th token has already printed N of them; an interactive
process answers a line before it is sent the next), piped interactive prompts, prompt files,
token-space runs, the chat template an import keeps, and one line per bad key."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from blocklab import checkpoint as ckpt
from blocklab.config import compose
from blocklab.model.generate import generate
from blocklab.sample import Pieces, load_sampler, render_chat
from blocklab.train.run import train
from data.test_text_runs import corpus
from inprocess import SAFETY_S, run_cli
from train.test_train_cli import BIN

pytestmark = pytest.mark.slow

WINDOW = 32  # model.max_seq_len of the tiny runs
PROMPT = "the king and the queen"
TIMEOUT = SAFETY_S  # a safety net for the subprocesses, never a measurement


def _tiny_text_run(root: Path, model: str) -> Path:
    """A two-step text run (byte tokenizer) of a 1-layer model with ``WINDOW`` positions;
    weights drawn wide so that greedy output varies with context and position."""
    data = corpus(root, n_files=8, words=120)
    run = root / model
    train(compose("train", [
        "data=text_files", f"data.files=[{data}]", "tokenizer=byte",
        f"data.cache_dir={root / 'cache'}", f"data.seq_len={WINDOW}", "data.batch_size=4",
        f"model={model}", "model.vocab_size=null", "model.n_layers=1", "model.d_model=32",
        "model.n_heads=2", "model/attention=mha", "model.d_ff=64",
        f"model.max_seq_len={WINDOW}", "model.init_std=0.5", "trainer.max_steps=2",
        "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
        "trainer.progress_bar=false", "probes=none", "checkpoint_probes.enabled=false",
        f"run_dir={run}"]))
    return run


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> Path:
    """GPT-2-like: a learned position table of WINDOW positions."""
    return _tiny_text_run(tmp_path_factory.mktemp("gen"), "gpt2_tiny")


@pytest.fixture(scope="module")
def rotary(tmp_path_factory) -> Path:
    """Llama-like: rotary positions, no table."""
    return _tiny_text_run(tmp_path_factory.mktemp("gen"), "llama_tiny")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("gen") / "syn"
    train(compose("train", ["experiment=smoke", "trainer.max_steps=2",
                            "trainer.ckpt_every_steps=2", "trainer.val_every_steps=2",
                            "probes=none", f"run_dir={run}"]))
    return run


def gen(capfd, run: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli(capfd, "blocklab-generate", f"ckpt={run}", *args)


def reference(run: Path, text: str, n: int, *, eos: bool = True) -> tuple[list[int], str]:
    """``generate()`` itself, greedy, on the checkpoint: (new ids, their text)."""
    model, tok, meta = ckpt.load_model(run)
    ids = [meta["specials"]["bos"], *tok.encode(text, add_special_tokens=False).ids]
    new = generate(model, torch.tensor([ids]), max_new_tokens=n,
                   eos_id=meta["specials"]["eos"] if eos else None)[0].tolist()
    return new, tok.decode(new, skip_special_tokens=True)


def sliding_reference(run: Path, text: str, n: int, window: int) -> str:
    """Greedy by hand: every next token from the model run on the last ``window`` tokens."""
    model, tok, meta = ckpt.load_model(run)
    ids = [meta["specials"]["bos"], *tok.encode(text, add_special_tokens=False).ids]
    start = len(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids[-window:]]))[0, -1].argmax()))
    return tok.decode(ids[start:], skip_special_tokens=True)


# ------------------------------------------------------------------------- greedy and EOS


@pytest.mark.parametrize("which", ["learned", "rotary"])
def test_greedy_output_equals_generate(which, request, capfd):
    run = request.getfixturevalue(which)
    r = gen(capfd, run, f"prompt={PROMPT}", "temperature=0", "max_new_tokens=8")
    assert r.returncode == 0, r.stderr
    _, text = reference(run, PROMPT, 8)
    assert r.stdout == PROMPT + text + "\n"
    assert "tokens/s" in r.stderr.splitlines()[-1]
    assert "sliding" not in r.stderr  # it fits the table
    newest = ckpt.list_checkpoints(run)[-1]  # a checkpoint directory, named directly
    again = run_cli(capfd, "blocklab-generate", f"ckpt={newest}", f"prompt={PROMPT}",
                    "temperature=0", "max_new_tokens=8")
    assert again.returncode == 0 and again.stdout == r.stdout, again.stderr


def _with_eos(run: Path, dest: Path, eos: int) -> Path:
    """``run``'s checkpoint again, its tokenizer's end-of-sequence id set to ``eos``."""
    newest = ckpt.list_checkpoints(run)[-1]
    state = torch.load(newest / ckpt.STATE, weights_only=True)
    state["blocklab"]["specials"]["eos"] = eos
    ckpt.write_checkpoint(dest / "checkpoints" / newest.name, state)
    return dest


def test_sampling_stops_at_eos_by_default(learned, tmp_path, capfd):
    new, _ = reference(learned, PROMPT, 8, eos=False)
    # the id greedy decoding emits fourth becomes the end-of-sequence token (its first
    # occurrence: the sample stops there)
    stop = new.index(new[3]) + 1
    run = _with_eos(learned, tmp_path / "eos", new[3])
    _, tok, _ = ckpt.load_model(run)
    r = gen(capfd, run, f"prompt={PROMPT}", "temperature=0", "max_new_tokens=8")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + tok.decode(new[:stop]) + "\n"
    assert f" {stop} new tokens" in r.stderr
    r = gen(capfd, run, f"prompt={PROMPT}", "temperature=0", "max_new_tokens=8",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + tok.decode(new) + "\n" and " 8 new tokens" in r.stderr


# ----------------------------------------------------------------------------------- seeds


def test_a_seed_reproduces_its_samples_whatever_the_global_rng(rotary, capfd):
    args = (f"prompt={PROMPT}", "temperature=1.5", "top_k=0", "top_p=0.95", "num_samples=2",
            "max_new_tokens=12", "stop_at_eos=false")
    torch.manual_seed(123)
    first = gen(capfd, rotary, *args, "seed=3")
    torch.manual_seed(456)
    again = gen(capfd, rotary, *args, "seed=3")
    other = gen(capfd, rotary, *args, "seed=4")
    assert first.returncode == again.returncode == other.returncode == 0, first.stderr
    assert first.stdout == again.stdout != other.stdout
    a, b = first.stdout.split("---\n")
    assert a != b and a.startswith(PROMPT) and b.startswith(PROMPT)  # two samples, in turn


# ---------------------------------------------------------------------- the sliding context


def test_sampling_past_a_learned_table_slides_the_context(learned, capfd):
    n = 3 * WINDOW
    r = gen(capfd, learned, f"prompt={PROMPT}", "temperature=0", f"max_new_tokens={n}",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + sliding_reference(learned, PROMPT, n, WINDOW) + "\n"
    # a negative control: a window one token shorter gives another text
    assert r.stdout != PROMPT + sliding_reference(learned, PROMPT, n, WINDOW - 1) + "\n"
    assert r.stderr.count("sliding context of the last 32 tokens") == 1


def test_a_prompt_longer_than_the_table_is_cropped_and_said_once(learned, capfd, monkeypatch):
    long = " ".join(["the crown of the river"] * 3)  # 3 x 22 bytes + BOS > 32 positions
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{long}\n{long}\n"))
    r = gen(capfd, learned, "interactive=true", "temperature=0", "max_new_tokens=5",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    answer = sliding_reference(learned, long, 5, WINDOW)
    assert r.stdout == f"{answer}\n{answer}\n"
    assert r.stderr.count("sliding context") == 1 and "tokens are cropped" in r.stderr


def test_a_rotary_model_just_continues_past_its_training_length(rotary, capfd):
    n = 2 * WINDOW
    r = gen(capfd, rotary, f"prompt={PROMPT}", "temperature=0", f"max_new_tokens={n}",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + reference(rotary, PROMPT, n, eos=False)[1] + "\n"
    assert "sliding" not in r.stderr


# ------------------------------------------------------------------------------- streaming


def test_incremental_decoding_keeps_multibyte_characters_whole():
    from blocklab.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    text = "héllo € 😀 ok"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text)  # characters of several byte tokens
    pieces = Pieces(lambda i: tok.decode(i, skip_special_tokens=True), [1])
    out = [pieces.push(i) for i in ids] + [pieces.flush()]
    assert "".join(out) == text and not any("\ufffd" in p for p in out)
    assert out.count("") >= 4  # held back while a character was incomplete


def test_tokens_reach_stdout_before_the_end(learned):
    """The console script itself, killed right after its 5th token was written: those five
    are on stdout already (buffered output would have printed nothing)."""
    new, _ = reference(learned, PROMPT, 8, eos=False)
    _, tok, _ = ckpt.load_model(learned)
    r = subprocess.run([str(BIN / "blocklab-generate"), f"ckpt={learned}", f"prompt={PROMPT}",
                        "temperature=0", "max_new_tokens=8", "stop_at_eos=false", "threads=1"],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, "BLOCKLAB_FAULT": "SIGKILL@token:5"})
    assert r.returncode == -9, r.stderr
    assert r.stdout == PROMPT + tok.decode(new[:5])
    assert len(tok.decode(new[:5])) >= 3  # several pieces had arrived


def test_an_interactive_process_answers_each_line_before_the_next_is_sent(rotary):
    """Line by line over real pipes: the second prompt is written only after the first
    answer was read, so an answer held back until end of input would never come."""
    proc = subprocess.Popen([str(BIN / "blocklab-generate"), f"ckpt={rotary}",
                             "interactive=true", "temperature=0", "max_new_tokens=6",
                             "stop_at_eos=false", "threads=1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(TIMEOUT, proc.kill)  # safety net only
    timer.start()
    try:
        answers = []
        for prompt in ("the king", "the sword"):
            proc.stdin.write(prompt + "\n")
            proc.stdin.flush()
            answers.append(proc.stdout.readline())
        proc.stdin.close()
        rest, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait() == 0, err
    finally:
        timer.cancel()
    assert answers == [reference(rotary, p, 6, eos=False)[1] + "\n"
                       for p in ("the king", "the sword")]
    assert rest == "" and err.count("tokens/s") == 2


# -------------------------------------------------------------------------------- prompts


def test_interactive_mode_answers_every_piped_line(rotary, capfd, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("the king\n\nthe queen\n"))
    r = gen(capfd, rotary, "interactive=true", "temperature=0", "max_new_tokens=6",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(reference(rotary, p, 6, eos=False)[1] + "\n"
                               for p in ("the king", "the queen"))  # the empty line skipped
    assert r.stderr.count("tokens/s") == 2


def test_a_prompt_file_is_one_prompt(rotary, tmp_path, capfd):
    text = "the king\nand the queen\n"
    (tmp_path / "p.txt").write_text(text)
    r = gen(capfd, rotary, f"prompt_file={tmp_path / 'p.txt'}", "temperature=0",
            "max_new_tokens=6", "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == text + reference(rotary, text, 6, eos=False)[1] + "\n"


def test_a_token_space_run_prints_token_names(synthetic, capfd):
    from blocklab.sample import token_names

    model, vocab, _ = ckpt.load_model(synthetic)
    names = token_names(vocab)
    prompt = ["<bos>", "k3", "v5", "<sep>", "k3"]
    new = generate(model, torch.tensor([[names.index(n) for n in prompt]]),
                   max_new_tokens=6)[0].tolist()
    r = gen(capfd, synthetic, "prompt=bos k3 v5 sep k3", "temperature=0", "max_new_tokens=6",
            "stop_at_eos=false")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "bos k3 v5 sep k3 " + " ".join(names[i] for i in new) + "\n"
    assert r.stderr.count("token-space run (synthetic vocabulary)") == 1
    r = gen(capfd, synthetic, "prompt=bos k99")
    assert r.returncode == 2 and "'k99' is not a token" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # the note and the one-line error


# ------------------------------------------------------------------------- chat templates

CHAT = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}w10 "
        "{{ m['content'] }} w11{% endif %}{% endfor %}{% if add_generation_prompt %} w12"
        "{% endif %}")


@pytest.fixture(scope="module")
def chat_import(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random HF Llama whose tokenizer has a chat template, imported."""
    pytest.importorskip("transformers")
    from blocklab.convert import import_model
    from convert.test_hf_roundtrip import _save

    tmp = tmp_path_factory.mktemp("chat")
    _, src = _save(tmp, "llama-mha-untied-nobias")
    (src / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT}))
    import_model(str(src), tmp / "imported", log=lambda _: None)
    return src, tmp / "imported"


def test_chat_applies_the_template_an_import_keeps(chat_import, capfd):
    from transformers import PreTrainedTokenizerFast

    src, imported = chat_import
    assert json.loads((imported / "tokenizer" / "tokenizer_config.json").read_text()) == {
        "chat_template": CHAT}
    hf = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"), bos_token="<s>",
                                 eos_token="</s>", pad_token="<pad>", chat_template=CHAT)
    ids = hf.apply_chat_template([{"role": "user", "content": "w20 w21"}],
                                 add_generation_prompt=True, return_dict=False)
    assert ids[0] == hf.bos_token_id and ids[-1] == hf.convert_tokens_to_ids("w12")
    model, tok, _ = ckpt.load_model(imported)
    new = generate(model, torch.tensor([ids]), max_new_tokens=5,
                   eos_id=hf.eos_token_id)[0].tolist()
    r = gen(capfd, imported, "prompt=w20 w21", "chat=true", "temperature=0",
            "max_new_tokens=5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == tok.decode(new, skip_special_tokens=True) + "\n"  # the reply only
    assert f"{len(ids)} prompt tokens" in r.stderr


def test_the_chat_template_renders_as_hugging_face_renders_it(smollm2_tokenizer):
    """SmolLM2-Instruct's own template (loops, a system turn, special markers)."""
    _, hf = smollm2_tokenizer
    messages = [{"role": "user", "content": "What is 2+2?"}]
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    names = {"bos_token": hf.bos_token, "eos_token": hf.eos_token}
    assert render_chat(hf.chat_template, "What is 2+2?", names, "smollm2") == want


def test_a_gguf_import_keeps_the_chat_template(smollm2_tokenizer):
    """SmolLM2-Instruct's GGUF carries its template in ``tokenizer.chat_template``: the import
    keeps the very text Hugging Face's GGUF loading reads."""
    from blocklab.convert import read_pretrained

    (source, gguf), hf = smollm2_tokenizer
    assert read_pretrained(source, gguf=gguf).chat_template == hf.chat_template


def test_chat_without_a_template_is_refused_in_one_line(rotary, capfd):
    r = gen(capfd, rotary, "prompt=hi", "chat=true")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"config error: chat=true: {ckpt.list_checkpoints(rotary)[-1]} has no chat template "
        "(imported Hugging Face models keep theirs; a blocklab run has none); drop chat"]


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("args, key", [
    (["max_new_tokens=0"], "max_new_tokens"),
    (["temperature=-1"], "temperature"),
    (["top_k=-1"], "top_k"),
    (["top_p=0"], "top_p"),
    (["top_p=1.5"], "top_p"),
    (["num_samples=0"], "num_samples"),
    (["seed=-1"], "seed"),
    (["device=tpu"], "device"),
    (["threads=0"], "threads"),
    (["prompt=a", "prompt_file=b.txt"], "prompt_file"),
    (["interactive=true", "prompt=a"], "prompt"),
    (["prompt_file=no-such-file.txt"], "prompt_file"),
])
def test_a_bad_key_is_refused_in_one_line_before_anything_is_loaded(rotary, capfd, args, key):
    r = gen(capfd, rotary, *args)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"config error: {key}=") and r.stdout == ""


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_prompt_file_is_refused_in_one_line(rotary, tmp_path, capfd, content):
    """An empty file is a mistake (a wrong redirect, an unsaved editor), not a request to
    sample from BOS: refused, naming the file, before the model is read."""
    (tmp_path / "p.txt").write_text(content)
    r = gen(capfd, rotary, f"prompt_file={tmp_path / 'p.txt'}")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"config error: prompt_file={str(tmp_path / 'p.txt')!r}: empty (no text to continue); "
        "write a prompt into it, or drop prompt_file to sample from BOS"]


def test_a_missing_checkpoint_or_none_at_all_is_refused(tmp_path, capfd):
    r = run_cli(capfd, "blocklab-generate", "prompt=a")
    assert r.returncode == 2 and r.stderr.startswith("config error: ckpt=None: required")
    r = run_cli(capfd, "blocklab-generate", f"ckpt={tmp_path / 'nothing'}")
    assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 1


def test_generate_streams_each_token_to_on_token(rotary):
    """The hook the command streams through: every token, in order, as sampled; the same with
    and without the cache."""
    model, _, _ = ckpt.load_model(rotary)
    ids = torch.tensor([[1, 40, 41, 42]])
    for use_cache in (True, False):
        seen: list[int] = []
        out = generate(model, ids, max_new_tokens=7, use_cache=use_cache,
                       on_token=lambda t, seen=seen: seen.append(int(t[0])))
        assert seen == out[0].tolist()


def test_load_sampler_reads_an_import_like_a_run(chat_import):
    s = load_sampler(chat_import[1], "cpu")
    assert s.chat_template == CHAT and s.family == "decoder" and not s.token_space
