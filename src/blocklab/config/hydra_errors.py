"""Hydra's composition errors in blocklab's one-line form.

Hydra reports a composition error in several lines, tells the user to add ``+`` for a typo'd
key (which would add the typo, since ``+`` force-adds), lists the config search path, and
ends with "Set the environment variable HYDRA_FULL_ERROR=1". :func:`composition_error` turns
each kind into one ``config error: <override>: <rule>[; <hint>]`` line (exit code 2): an
unknown group option lists the options, a typo'd key names the closest known key, a wrong
type names the key, the value and the type, an unparsable override the override and the
grammar."""

from __future__ import annotations

import re
from collections.abc import Sequence

from blocklab.config.migrate import renamed
from blocklab.config.strict import HIDDEN_OPTIONS, closest, key_problem, option_problem
from blocklab.errors import ConfigError

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def _first(text: object) -> str:
    return next((s.strip() for s in str(text).splitlines() if s.strip()), "")


def _override(overrides: Sequence[str], key: str, value: str | None = None) -> str | None:
    """The command-line override that sets ``key`` (or group ``key``; to a value holding
    ``value`` when given), as typed."""
    for o in overrides:
        name, _, typed = o.lstrip("+~").partition("=")
        if name.split("@", 1)[0] == key and (value is None or value in typed):
            return o
    return None


def _missing(e: Exception, overrides: Sequence[str]) -> ConfigError | None:
    """``model/position=bogus``, or ``callbacks=[early_stoping]`` (an option in a list: Hydra
    names it without the options): not an option of the group (the options listed)."""
    missing, options = getattr(e, "missing_cfg_file", None), getattr(e, "options", None)
    if not missing or "/" not in missing:
        return None
    group, option = missing.rsplit("/", 1)
    if options is None:
        options = _group_options(e, group)
    if options is None:
        return None
    shown = _override(overrides, group, option)
    where = re.match(r"In '([^']+)'", str(e))
    named = (f"{group}={option} (named in {where.group(1)})" if shown is None and where
             else shown or f"{group}={option}")
    problem = option_problem(group, option, [o for o in options if o not in HIDDEN_OPTIONS])
    if problem is None:
        return None
    return ConfigError(f"config error: {named}: {option!r} is {problem}")


def _group_options(e: Exception, group: str) -> list[str] | None:
    """The options of config group ``group`` in the repository Hydra was loading from when it
    raised ``e`` (the user's ``--config-dir`` included: the ``repo`` of the frame that raised
    it, Hydra's ``config_not_found_error``); None when no frame holds one."""
    from hydra.core.object_type import ObjectType

    tb = e.__traceback__
    while tb is not None:
        repo = tb.tb_frame.f_locals.get("repo")
        if callable(getattr(repo, "get_group_options", None)):
            return list(repo.get_group_options(group, ObjectType.CONFIG))
        tb = tb.tb_next
    return None


def _typo(key: str, line: str, cause: BaseException | None, schema: type | None
          ) -> ConfigError:
    """``model.n_layer=3`` (no ``+``): the closest known key, never "add a +" -- except below
    an open mapping (``model.mixer.options``), where adding a key is what ``+`` is for. A key
    an earlier version had (``model.attention.window``) names its new place; a mixer option
    the chosen mixer's file does not list names the mixer that owns it."""
    if new := renamed(key):
        value = line.split("=", 1)[-1]
        return ConfigError(f"config error: {line}: {key} is now {new} (a softmax option); set "
                           f"{new}={value}")
    parent, _, leaf = key.rpartition(".")
    if parent == "model.mixer":
        from blocklab.config.mixer_options import compose_hint

        return ConfigError(f"config error: {line}: {compose_hint(leaf)}")
    if "is not in struct" in str(cause) and "Dict[" in str(cause):
        parent = key.rpartition(".")[0]
        return ConfigError(f"config error: {line}: {parent} is a free-form mapping; add a key "
                           f"to it with +{line}")
    if key.split(".")[0] == "hydra":
        from hydra.conf import HydraConf

        hint = closest(key.removeprefix("hydra."), HydraConf)
        tail = f"did you mean hydra.{hint}?" if hint else "--cfg hydra lists them"
        return ConfigError(f"config error: {line}: not a key of Hydra's config; {tail}")
    if "/" in key:  # a group path that is not a group: perhaps a key meant
        dotted = key.replace("/", ".")
        if key_problem(dotted, schema) is None and schema is not None:
            return ConfigError(f"config error: {line}: not a config group; did you mean "
                               f"{dotted}={line.split('=', 1)[-1]}?")
        hint = closest(dotted, schema)
        tail = f"; did you mean {hint.replace('.', '/')}?" if hint else ""
        return ConfigError(f"config error: {line}: not a config group or key{tail}")
    problem = key_problem(key, schema) or "not a config key"
    return ConfigError(f"config error: {line}: {problem}")


def _from_message(e: Exception, overrides: Sequence[str], schema: type | None
                  ) -> ConfigError | None:
    """The kinds of ConfigCompositionException, told apart by their messages (Hydra 1.3)."""
    msg, cause = str(e), e.__cause__
    if m := re.match(r"Could not override '([^']+)'\.\nTo append to your config use \+(.*)",
                     msg):
        return _typo(m.group(1), m.group(2), cause, schema)
    if m := re.match(r"Error merging override (.*)", msg):
        line = m.group(1)
        rule = _first(cause) if cause is not None else "cannot be merged"
        key = line.lstrip("+~").split("=", 1)[0]
        if "is not a subclass of" in rule:  # model.position=rope: a group, not a value
            rule = f"{key} is a config group: choose an option with {key.replace('.', '/')}=..."
        return ConfigError(f"config error: {line}: {rule}")
    if m := re.match(r"Ambiguous value for argument '([^']+)'", msg):
        key, _, value = m.group(1).partition("=")
        return ConfigError(f"config error: {m.group(1)}: a comma-separated value is a sweep; "
                           f"sweep with -m (--multirun), or write a list: {key}=[{value}]")
    if m := re.match(r"Could not append to config\. An item is already at '([^']+)'", msg):
        line = _override(overrides, m.group(1)) or f"+{m.group(1)}=..."
        return ConfigError(f"config error: {line}: {m.group(1)} is a config key already; set "
                           f"it without the +: {line.lstrip('+')}")
    if m := re.match(r"Could not delete from config\. '([^']+)' does not exist", msg):
        line = _override(overrides, m.group(1)) or f"~{m.group(1)}"
        return ConfigError(f"config error: {line}: {key_problem(m.group(1), schema) or msg}")
    if m := re.match(r"In '([^']+)': \w+ raised while composing config", msg):
        key = getattr(cause, "full_key", None) or "?"
        rule = _first(cause)
        if rule.startswith("Key ") and " not in " in rule:
            rule = key_problem(key, schema) or rule
        return ConfigError(f"config error: {key} (in {m.group(1)}): {rule}")
    return None


def composition_error(e: BaseException, overrides: Sequence[str] = (),
                      schema: type | None = None) -> ConfigError | None:
    """``e`` (raised while Hydra parsed the overrides or composed the config) as a one-line
    ConfigError, or None when it is not a composition error. ``overrides`` are the command
    line's, ``schema`` the command's schema (for the closest known key)."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, ConfigError):
        return e
    if isinstance(e, OverrideParseException):
        return ConfigError(f"config error: {e.override}: not a valid override "
                           f"({_first(e.message)}); quote values with spaces or brackets, "
                           f"e.g. 'data.files=[a.txt,b.txt]' ({GRAMMAR})")
    if isinstance(e, MissingConfigException) and (err := _missing(e, overrides)):
        return err
    if isinstance(e, HydraException):
        if err := _from_message(e, overrides, schema):
            return err
        cause = f"; {_first(e.__cause__)}" if e.__cause__ is not None else ""
        return ConfigError(f"config error: {_first(e)}{cause}")
    if isinstance(e, OmegaConfBaseException):
        return ConfigError(f"config error: {getattr(e, 'full_key', None) or '?'}: {_first(e)}")
    return None
