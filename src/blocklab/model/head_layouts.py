"""The head layouts of every mixer with heads (``model.attention.name``: MHA / GQA / MQA): how
query heads share key/value heads. Registered from attention.py's ``ATTENTIONS`` (re-exported
there), kept apart so the softmax mixer's file stays one readable file."""

from __future__ import annotations

from blocklab.config import AttentionConfig
from blocklab.config.checks import require


class HeadLayout:
    """How query heads share key/value heads (``model.attention.name``), for every mixer that
    has heads: ``kv_heads`` resolves the count and ``check`` states the layout's rule (the
    validator asks the layout, so a registered one brings its own)."""

    @classmethod
    def kv_heads(cls, cfg: AttentionConfig, n_heads: int) -> int:
        return n_heads if cfg.n_kv_heads is None else cfg.n_kv_heads

    @classmethod
    def check(cls, cfg: AttentionConfig, n_heads: int, key: str) -> None:
        kv = cls.kv_heads(cfg, n_heads)
        require(1 <= kv <= n_heads and n_heads % kv == 0, f"{key}.n_kv_heads", kv,
                f"must be in [1, n_heads={n_heads}] and divide n_heads")


class MHA(HeadLayout):
    """One K/V head per query head."""

    @classmethod
    def check(cls, cfg: AttentionConfig, n_heads: int, key: str) -> None:
        super().check(cfg, n_heads, key)
        kv = cls.kv_heads(cfg, n_heads)
        require(kv == n_heads, f"{key}.n_kv_heads", kv,
                f"mha needs n_kv_heads == n_heads={n_heads}", "use model/attention=gqa or mqa")


class GQA(HeadLayout):
    """Groups of query heads share a K/V head ("GQA", arXiv 2305.13245): n_kv_heads set."""

    @classmethod
    def kv_heads(cls, cfg: AttentionConfig, n_heads: int) -> int:
        require(cfg.n_kv_heads is not None, "model.attention.n_kv_heads", None,
                "gqa needs n_kv_heads set", "e.g. model.attention.n_kv_heads=2")
        return cfg.n_kv_heads  # type: ignore[return-value]

    @classmethod
    def check(cls, cfg: AttentionConfig, n_heads: int, key: str) -> None:
        super().check(cfg, n_heads, key)
        kv = cls.kv_heads(cfg, n_heads)
        require(1 < kv < n_heads, f"{key}.n_kv_heads", kv,
                f"gqa needs 1 < n_kv_heads < n_heads={n_heads}", "use mha or mqa")


class MQA(HeadLayout):
    """One K/V head for all query heads ("Fast Transformer Decoding", arXiv 1911.02150)."""

    @classmethod
    def kv_heads(cls, cfg: AttentionConfig, n_heads: int) -> int:
        return 1 if cfg.n_kv_heads is None else cfg.n_kv_heads

    @classmethod
    def check(cls, cfg: AttentionConfig, n_heads: int, key: str) -> None:
        super().check(cfg, n_heads, key)
        kv = cls.kv_heads(cfg, n_heads)
        require(kv == 1, f"{key}.n_kv_heads", kv, "mqa needs n_kv_heads == 1")


ATTENTIONS: dict[str, type[HeadLayout]] = {
    "mha": MHA,
    "gqa": GQA,
    "mqa": MQA,
}
