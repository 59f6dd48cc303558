"""Each mixer owns its options: ``model.mixer``'s flat keys read into the options dataclass of
every mixer in use (``options`` on the mixer class, model/mixer.py), and refused when no mixer
in use declares them (unless at their owners' default: dropped, they change nothing).

``model.mixer`` holds the mixer choice (``name``, ``pattern``, ``encoder``) and the options of
the mixers in use, flat (``model.mixer.d_state=8``). A key is accepted when a mixer in use
declares it; an option two mixers in use declare (``chunk`` of linear and ssm) takes one
value. Any other key is refused in one line naming the mixer that owns it (or the closest key
of the mixers in use): it would be silently ignored. Cross-attention is softmax attention and
reads the options a mixer lists in ``cross_options`` (softmax: ``scale``, ``dropout``), so
those are in use whenever a stack has cross-attention. A plugin mixer without an options
dataclass reads the free-form ``model.mixer.options`` (its own ``check`` validates it).
Validation leaves ``model.mixer`` complete: every option of the mixers in use, typed, its
mixer's default where unset. Mixers are looked up only when a config is checked (torch-free
at import)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from blocklab.config.checks import _fail
from blocklab.config.model_schema import MIXER_FREE_KEY, ModelConfig


def options_of(mixer: type) -> type | None:
    """A mixer's options dataclass, or None (a plugin mixer that reads ``options``)."""
    opts = getattr(mixer, "options", None)
    return opts if isinstance(opts, type) and dataclasses.is_dataclass(opts) else None


def option_names(mixer: type) -> tuple[str, ...]:
    opts = options_of(mixer)
    return tuple(f.name for f in dataclasses.fields(opts)) if opts else ()


def owners() -> dict[str, list[str]]:
    """Option name -> the registered mixers that declare it (registry order)."""
    from blocklab import registry

    out: dict[str, list[str]] = {}
    for name, mixer in registry.table("mixer").items():
        for option in option_names(mixer):
            out.setdefault(option, []).append(name)
    return out


def in_use(m: ModelConfig, family: Any) -> dict[str, tuple[type, tuple[str, ...] | None]]:
    """Mixer name -> (its class, the options read: None = all it declares) for every mixer
    some layer uses, plus the mixers cross-attention reads options of (``cross_options``)."""
    from blocklab import registry

    used: dict[str, tuple[type, tuple[str, ...] | None]] = {}
    cross = False
    for n_layers, has_cross, causal in family.stacks(m):
        cross = cross or has_cross
        for i in range(n_layers):
            name = m.layer_mixer(i, causal)
            used.setdefault(name, (registry.lookup("mixer", name, m.mixer_key(causal)), None))
    if cross:
        for name, mixer in registry.table("mixer").items():
            reads = tuple(getattr(mixer, "cross_options", ()))
            if reads and name not in used:
                used[name] = (mixer, reads)
    return used


def _reads(mixer: type, reads: tuple[str, ...] | None) -> tuple[str, ...]:
    return option_names(mixer) if reads is None else reads


def validate_mixer_options(m: ModelConfig, key: str, family: Any) -> None:
    """Refuse a ``model.mixer`` key no mixer in use reads; type each mixer's options, fill in
    its defaults and ask its ``check_options`` (rules on the values alone)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    used = in_use(m, family)
    valid = sorted({o for mixer, reads in used.values() for o in _reads(mixer, reads)})
    free = [name for name, (mixer, _) in used.items() if options_of(mixer) is None]
    names = ", ".join(used)
    for option, value in m.mixer.settings().items():
        if option in valid:
            continue
        if _at_owners_default(option, value):  # e.g. softmax.yaml's under model.mixer.name=ssm
            del m.mixer[option]
            continue
        raise _fail(f"{key}.mixer.{option}", value, *unread(option, list(used), valid))
    if m.mixer.options and not free:
        raise _fail(f"{key}.mixer.{MIXER_FREE_KEY}", dict(m.mixer.options),
                    f"the mixers in use ({names}) read their options flat, not from "
                    f"{key}.mixer.{MIXER_FREE_KEY} (a plugin mixer without an options "
                    "dataclass reads it)", f"set e.g. {key}.mixer.<option>=... instead")
    if MIXER_FREE_KEY in m.mixer and not m.mixer.options and not free:
        del m.mixer[MIXER_FREE_KEY]
    for _name, (mixer, reads) in used.items():
        opts = options_of(mixer)
        if opts is None:
            continue
        fields = _reads(mixer, reads)
        given = {f: m.mixer[f] for f in fields if f in m.mixer}
        try:
            typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(opts), given))
        except OmegaConfBaseException as e:
            bad = str(getattr(e, "key", None) or next(iter(given), "?"))
            raise _fail(f"{key}.mixer.{bad}", given.get(bad), str(e).splitlines()[0]) from None
        for f in fields:
            m.mixer[f] = getattr(typed, f)
        rule = getattr(mixer, "check_options", None)
        if rule is not None:
            rule(typed, f"{key}.mixer")


def _at_owners_default(option: str, value: Any) -> bool:
    """``value`` is the default of every mixer declaring ``option``: unread, it changes
    nothing (a mixer file's listing left behind by ``model.mixer.name=...``), so it is dropped;
    any other value would be silently ignored, so it is refused."""
    from blocklab import registry

    table = registry.table("mixer")
    mine = [options_of(table[name]) for name in owners().get(option, [])]
    return bool(mine) and all(getattr(opts(), option) == value for opts in mine if opts)


def unread(option: str, used: list[str], valid: list[str]) -> tuple[str, str]:
    """(rule, hint) refusing ``model.mixer.<option>`` when the mixers ``used`` read ``valid``:
    the mixer that owns it, or the closest valid key."""
    mine = owners().get(option, [])
    near = difflib.get_close_matches(option, valid, n=1, cutoff=0.6)
    shown = ", ".join(used)
    if mine:
        rule = (f"an option of mixer {' / '.join(mine)}, and no layer uses it (mixers in use: "
                f"{shown})")
        hint = (f"did you mean model.mixer.{near[0]}?" if near else
                f"use model/mixer={mine[0]}, or put {mine[0]} in model.mixer.pattern")
        return rule, hint
    rule = f"not an option of the mixers in use ({shown})"
    if near:
        return rule, f"did you mean model.mixer.{near[0]}?"
    return rule, f"their options: {', '.join(valid) or '(none)'}"


def compose_hint(option: str) -> str:
    """Why ``model.mixer.<option>`` is not in a composed config (the chosen mixer's YAML file
    lists only its own options): which mixer owns it, or the closest option of any mixer."""
    mine = owners().get(option, [])
    if mine:
        return (f"an option of mixer {' / '.join(mine)}, which model/mixer=... does not list; "
                f"choose model/mixer={mine[0]}, or add it with +model.mixer.{option}=... when "
                f"{mine[0]} is in model.mixer.pattern / encoder")
    every = sorted({*owners(), "name", "pattern", "encoder"})
    near = difflib.get_close_matches(option, every, n=1, cutoff=0.6)
    if near:
        return f"not an option of any mixer; did you mean model.mixer.{near[0]}?"
    return f"not an option of any mixer; mixer options: {', '.join(sorted(owners()))}"
