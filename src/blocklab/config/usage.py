"""What ``--help`` lists: the config groups a command composes, with their options.

Each command's help is a Hydra help config (``configs/hydra/help/<command>.yaml``, chosen in
the command's primary config): a paragraph, the command's own keys and its docs, written
there. The groups are not written there: ``${blocklab_groups:...}`` in the template lists the
groups of the config actually composed (``hydra.runtime.choices``), with the choice made and
the options Hydra finds on the search path (user config directories too), leaving out the
structured-config bases (``schema``) that presets build on."""

from __future__ import annotations

import fnmatch
from typing import Any

from omegaconf import OmegaConf

from blocklab.config.strict import HIDDEN_OPTIONS

RESOLVER = "blocklab_groups"


def _options(group: str) -> list[str]:
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        return []
    found = GlobalHydra.instance().config_loader().get_group_options(group)
    return sorted(o for o in found if o not in HIDDEN_OPTIONS)


def groups_text(*patterns: str, _root_: Any) -> str:
    """One line per config group of the composed config that matches ``patterns`` (shell
    patterns; none = every group but Hydra's own, which are shown only when named exactly):
    ``  model/position=rope    alibi, learned, none, rope, sinusoidal, t5_bias``."""
    choices = OmegaConf.select(_root_, "hydra.runtime.choices") or {}
    rows = []
    for key, choice in choices.items():
        hydras = key.startswith("hydra/")
        if hydras and key not in patterns:
            continue
        if patterns and not hydras and not any(fnmatch.fnmatch(key, p) for p in patterns):
            continue
        options = _options(key.split("@", 1)[0])
        if options:
            rows.append((f"{key}={'null' if choice is None else choice}", ", ".join(options)))
    if not rows:
        return "  (none)"
    width = max(len(a) for a, _ in rows) + 2
    text = "\n".join(f"  {a:<{width}}{b}" for a, b in sorted(rows))
    return text.replace("$", "$$")  # Hydra fills the help template with string.Template


def register_help_resolver() -> None:
    """Make ``${blocklab_groups:...}`` known to OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, groups_text)
