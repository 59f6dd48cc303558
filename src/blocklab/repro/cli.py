"""The ``blocklab-repro`` command line.

    blocklab-repro --list
    blocklab-repro mqar --seeds 3                 # the full protocol (default size)
    blocklab-repro receptive_field --size quick   # the CPU subset CI runs
    blocklab-repro mqar --size quick --break one-layer   # must FAIL

Exit codes: 0 every expectation met, 1 an expectation missed, 2 a usage error or a failing
user plugin (one line); the training errors' own codes otherwise, in one line (7: preempted or
interrupted; the line gives the command that resumes it).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys

from blocklab.errors import standard_output
from blocklab.repro.experiments import experiment, names
from blocklab.repro.protocol import SIZES


def _parser(choices: list[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="blocklab-repro",
        description="Run a reference experiment and check its published result: prints "
                    "expected vs observed, exits 1 when an expectation is missed.",
        epilog="Docs: docs/reproductions.md (the experiments and their sources).")
    p.add_argument("name", nargs="?", choices=choices, help="the experiment")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--size", choices=SIZES, default="full",
                   help="full (the documented protocol; default) or quick (the CI subset)")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per arm (default: 3 for full, 1 for quick)")
    p.add_argument("--break", dest="broken", default=None, metavar="WHAT",
                   help="apply a deliberate defect the check must catch (see --list)")
    p.add_argument("--only", action="append", default=[], metavar="WORDS",
                   help="train and measure only the arms whose names contain WORDS (repeat "
                        "for more; e.g. --only attention --only 'window 8'): a part of the "
                        "table, whose checks of other arms read 'not measured' (exit 1)")
    p.add_argument("--root", default="outputs/repro", metavar="DIR",
                   help="runs are kept (and reused, by every experiment: the receptive-field "
                        "experiment's global arm is the mqar 2-layer arm) under DIR/runs "
                        "(default: outputs/repro)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where table.md and result.json go (default: "
                        "DIR/<name>/<size>[-break-<what>])")
    return p


def _list() -> str:
    lines = []
    for name in names():
        exp = experiment(name, "full")
        lines.append(f"{name}: {exp.title}")
        for what, (desc, _) in exp.breaks.items():
            lines.append(f"    --break {what}: {desc}")
    return "\n".join(lines)


@standard_output()  # a full disk: one line, exit 6; a reader gone (| head): exit 141
def main(argv: list[str] | None = None) -> None:
    from blocklab.registry import load_plugins

    try:  # user components, experiments among them, before the names are known
        load_plugins()
    except Exception as e:
        if not isinstance(getattr(e, "exit_code", None), int):
            raise
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    args = _parser(names()).parse_args(argv)
    if args.list:
        print(_list())
        return
    if args.name is None:
        print("blocklab-repro: name an experiment (one of " + ", ".join(names())
              + "), or --list", file=sys.stderr)
        sys.exit(2)
    exp = experiment(args.name, args.size)
    if args.broken is not None and args.broken not in exp.breaks:
        print(f"blocklab-repro: --break {args.broken}: not a defect of {args.name}; known: "
              + ", ".join(exp.breaks), file=sys.stderr)
        sys.exit(2)
    from blocklab.repro.runner import chosen

    arm_names = [a.name for a in exp.sizes[args.size].arms]
    for words in args.only:
        if not any(chosen(n, [words]) for n in arm_names):
            print(f"blocklab-repro: --only {words!r}: names no arm of {args.name} --size "
                  f"{args.size}; arms: " + ", ".join(arm_names), file=sys.stderr)
            sys.exit(2)
    if args.broken is not None:
        arms = exp.sizes[args.size].arms
        broken = exp.breaks[args.broken][1](arms)
        if all(a == b for a, b in zip(arms, broken) if chosen(a.name, args.only)):
            print(f"blocklab-repro: --break {args.broken}: changes no row of {args.name} "
                  f"--size {args.size}" + (" --only ..." if args.only else "")
                  + f" ({exp.breaks[args.broken][0]})", file=sys.stderr)
            sys.exit(2)
    if args.seeds is not None and args.seeds < 1:
        print(f"blocklab-repro: --seeds {args.seeds}: must be >= 1", file=sys.stderr)
        sys.exit(2)
    try:
        passed = _run(args, exp)
    except Exception as e:
        code = getattr(e, "exit_code", None)  # blocklab's user errors carry their exit code
        if not isinstance(code, int):
            raise  # a bug: its traceback
        print(_one_line(e, sys.argv[1:] if argv is None else argv), file=sys.stderr)
        sys.exit(code)
    sys.exit(0 if passed else 1)


def _run(args: argparse.Namespace, exp) -> bool:
    from blocklab.repro.runner import report, run, write
    from blocklab.runlock import writable_dir

    # both checked before anything trains; runs are shared by every experiment: root/runs/<key>
    root = writable_dir(args.root, "--root")
    out = writable_dir(args.out or root / args.name / (
        args.size + (f"-break-{args.broken}" if args.broken else "")
        + ("-only-" + "-".join(re.sub(r"[^A-Za-z0-9]+", "_", w) for w in args.only)
           if args.only else "")), "--out")
    outcome = run(exp, size=args.size, seeds=args.seeds, root=root, broken=args.broken,
                  only=tuple(args.only), log=lambda s: print(s, file=sys.stderr))
    write(exp, outcome, out)
    report(exp, outcome)
    return outcome.passed


def _one_line(e: Exception, argv: list[str]) -> str:
    """The error's line. A preempted or interrupted arm resumes by rerunning this same command
    (finished runs are reused, an interrupted one resumes from its checkpoint, exactly), so
    that is the command the line names -- not the ``blocklab-train resume=`` of one arm."""
    message = str(e.args[-1] if isinstance(e, OSError) and e.args else e).splitlines()[0]
    if getattr(e, "exit_code", None) == 7:  # train.run.Preempted
        message = message.split("; resume exactly with:")[0]
        return f"{message}; resume exactly with: blocklab-repro {shlex.join(argv)}"
    return message
