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
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()
    # the loader's own repository: its get_group_options deep-copies it first (0.15 s a group)
    repo = getattr(loader, "repository", None)
    found = (repo.get_group_options(group, ObjectType.CONFIG) if repo is not None
             else loader.get_group_options(group))
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


def _get_help(self, help_cfg, cfg, args_parser, resolve: bool) -> str:
    """Hydra's ``get_help``, filling ``$APP_CONFIG_GROUPS`` / ``$HYDRA_CONFIG_GROUPS`` only for a
    template that names them. Hydra lists every group for both, named or not: about 160 config
    repositories built, 10 s of a 12 s ``--help``. blocklab's templates name neither (the groups
    come from ``${blocklab_groups:...}``); a user's own ``hydra/help`` that does gets them."""
    if "CONFIG_GROUPS" not in str(help_cfg.template):
        self.format_config_groups = lambda predicate, compact=True: ""
    try:
        return _HYDRA_GET_HELP(self, help_cfg, cfg, args_parser, resolve)
    finally:
        self.__dict__.pop("format_config_groups", None)


_HYDRA_GET_HELP = None


def register_help_resolver() -> None:
    """Make ``${blocklab_groups:...}`` known to OmegaConf, and Hydra's help fill only the
    placeholders a template names (idempotent)."""
    global _HYDRA_GET_HELP
    from hydra._internal.hydra import Hydra

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, groups_text)
    if _HYDRA_GET_HELP is None:
        _HYDRA_GET_HELP = Hydra.get_help
        Hydra.get_help = _get_help
