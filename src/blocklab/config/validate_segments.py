"""The rules of a run that reads long documents segment by segment (``data.segment_mode``;
docs/memory.md) against its model and trainer: who carries state, how far positions go, which
memories may be combined. Part of ``validate_train`` (config/validate.py)."""

from __future__ import annotations

from blocklab.config.checks import _check
from blocklab.config.schema import TrainConfig


def validate_segment_run(tc: TrainConfig) -> None:
    """The rules between ``data.segment_mode`` and the model and trainer (docs/memory.md): a
    causal decoder carries state from segment to segment; stream mode runs on one process and
    needs a row of >= 1 segments; forwards that write state are neither re-run (activation
    checkpointing) nor traced (compile); RMT's memory tokens travel with one document."""
    mode, t, m = tc.data.segment_mode, tc.trainer, tc.model
    n = m.memory_tokens
    _check(n >= 0, "model.memory_tokens", n, "must be >= 0 (0 = no memory tokens)")
    _check(n == 0 or mode == "split", "model.memory_tokens", n,
           "memory tokens travel with one document: data.segment_mode=split")
    if n:
        _check(not m.mixer.get("mem_len"), "model.memory_tokens", n,
               f"memory tokens and model.mixer.mem_len={m.mixer.get('mem_len')} are two "
               "memories; use one (for now)")
        from blocklab import registry

        scheme = registry.lookup("position", m.position.name, "model.position.name")
        limit = scheme.positions_limit(m.position, max_seq_len=m.max_seq_len)
        need = tc.data.seq_len + 2 * n
        _check(limit is None or limit >= need, "model.max_seq_len", m.max_seq_len,
               f"the {m.position.name} position table must cover a segment and its memory "
               f"tokens: data.seq_len + 2 x model.memory_tokens = {need}")
    check_xl_memory(tc)
    if mode == "none":
        return
    key = "data.segment_mode"
    _check(m.family.name == "decoder", key, mode,
           f"carried state needs a causal decoder (model.family.name=decoder, not "
           f"{m.family.name})")
    _check(mode != "stream" or (t.devices == 1 and t.num_nodes == 1), key, mode,
           f"stream runs on one process for now (trainer.devices={t.devices}, "
           f"trainer.num_nodes={t.num_nodes})")
    _check(mode != "stream" or t.bptt >= 1, "trainer.bptt", t.bptt,
           "stream mode reads rows of trainer.bptt segments: must be >= 1 "
           "(0 = the whole document is for data.segment_mode=split)")
    for name, why in (("activation_checkpointing", "would re-run"), ("compile", "would trace")):
        _check(not getattr(t, name), f"trainer.{name}", True,
               f"{why} forwards that write carried state ({key}={mode})",
               f"set trainer.{name}=false")
    check_carried_positions(tc)


def check_carried_positions(tc: TrainConfig) -> None:
    """A segment mode carries state: positions continue across a document's segments (a
    position table must cover the document: split mode's ``data.doc_len``; a stream's never
    end), and a state that keeps every token grows without end in a stream."""
    from blocklab import registry

    m, d = tc.model, tc.data
    if not m.memory_tokens:  # memory tokens restart positions each segment (model/rmt.py)
        scheme = registry.lookup("position", m.position.name, "model.position.name")
        limit = scheme.positions_limit(m.position, max_seq_len=m.max_seq_len)
        _check(limit is None or d.segment_mode != "stream", "model.position.name",
               m.position.name, "positions continue across segments and a stream's never end; "
               "a position table cannot follow them: use rope, alibi, t5_bias or none")
        top = d.doc_len or d.seq_len
        _check(limit is None or limit >= top, "model.max_seq_len", m.max_seq_len,
               f"positions continue across a document's segments: the {m.position.name} "
               f"position table must cover data.doc_len={top}")
    if d.segment_mode == "stream":
        for name in {m.mixer.name, *m.mixer.pattern}:
            grows = registry.lookup("mixer", name, "model.mixer.name").growing_carry(m)
            _check(grows is None, "data.segment_mode", "stream",
                   f"{grows} keeps every token of a document and a stream's documents never "
                   "end: use data.segment_mode=split (or a bounded state)")


def check_xl_memory(tc: TrainConfig) -> None:
    """``model.mixer.mem_len`` (softmax's XL memory, model/memory.py) against the data and the
    positions: a memory is carried only in a segment mode; the whole document (null) only in
    split mode; a memory of earlier segments' tokens needs relative positions."""
    m, mode = tc.model, tc.data.segment_mode
    if "mem_len" not in m.mixer:
        return
    n = m.mixer.get("mem_len")
    _check(n is not None or mode == "split", "model.mixer.mem_len", n,
           "null keeps every key of the document: needs data.segment_mode=split (not "
           f"{mode})")
    if not n:
        return
    _check(mode != "none", "model.mixer.mem_len", n,
           "memory across segments needs data.segment_mode=split or stream")
    from blocklab import registry

    scheme = registry.lookup("position", m.position.name, "model.position.name")
    root = next(c for c in reversed(scheme.__mro__) if "embed" in vars(c))  # adds nothing
    _check(scheme.embed is root.embed, "model.mixer.mem_len", n,
           "memory across segments needs relative positions (rotary, a score bias or none); "
           f"model.position.name={m.position.name} embeds absolute ones")
