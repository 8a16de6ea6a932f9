"""Command-line value types and the one-line usage error, shared by the CLI and every command
module that defines its own options. The lowest floor: imports nothing of the package, so a
module anywhere may take `positive` without importing the CLI above it."""
from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path


class UsageError(Exception):
    """A wrong name or value on the command line: one line to stderr, exit 2."""


def positive(kind=float, zero_ok: bool = False, most=None):
    """argparse type: a finite number > 0 (>= 0 with zero_ok; a whole one for kind=int), at
    most `most` when given (what one machine can run: the demo's robots are processes)."""
    def parse(v: str):
        try:
            x = kind(v)
        except ValueError:
            x = None
        if x is None or not math.isfinite(x) or x < 0 or (x == 0 and not zero_ok) or (most is not None and x > most):
            raise argparse.ArgumentTypeError(
                f"must be a {'whole ' if kind is int else ''}number {'>= 0' if zero_ok else '> 0'}"
                + (f" and <= {most}" if most is not None else "") + f", got {v!r}")
        return x

    return parse


def between(lo: float, hi: float):
    """argparse type: a finite number in [lo, hi] (a cosine, a fraction)."""
    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not lo <= x <= hi:  # nan fails both
            raise argparse.ArgumentTypeError(f"must be a number in [{lo:g}, {hi:g}], got {v!r}")
        return x

    return parse


def host(v: str) -> str:
    """argparse type of a --host to listen on: a name or address that resolves (a typo is one line
    here, not the server library's log line and a bind failure later)."""
    import socket

    try:
        socket.getaddrinfo(v, None)
    except (socket.gaierror, UnicodeError) as e:
        raise argparse.ArgumentTypeError(f"{v!r} does not resolve to an address ({e})") from None
    return v


def device(v: str) -> str:
    """argparse type of a torch --device, checked without importing torch: cpu, cuda, cuda:N, mps."""
    kind, _, index = v.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and not (kind == "cuda" and index.isdigit())):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or mps, got {v!r}")
    return v


def seed(v: str) -> int:
    """argparse type of every --seed/--seeds: a whole number >= 0, what numpy's generators take."""
    return positive(int, zero_ok=True)(v)


def comma_list(choices):
    """argparse type: comma-separated names, each one of `choices`, no repeats."""
    def parse(v: str) -> list:
        names = [n for n in v.split(",") if n]
        for n in names:
            if n not in choices:
                raise argparse.ArgumentTypeError(f"{n!r} is not one of {', '.join(choices)}")
        if not names or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"must name each of {', '.join(choices)} at most once, got {v!r}")
        return names

    return parse


def scratch(name: str) -> str:
    """A default output folder or file: a scratch path that exists wherever the command runs
    (a checkout or an installed package) and never dirties a git tree or the package; a run
    of record is written on purpose with --out (and --force over the one in git)."""
    return str(Path(tempfile.gettempdir()) / f"robotserve-{name}")


def check_out(path, force: bool) -> None:
    """Refuse to write over a non-empty --out the user named unless --force: an existing folder
    with anything in it, or an existing non-empty file (`--out models/metaworld_flow` would
    otherwise replace the trained policy)."""
    p = Path(path)
    full = p.is_dir() and any(p.iterdir()) or p.is_file() and p.stat().st_size > 0
    if full and not force:
        raise UsageError(f"--out {str(path)!r} is not empty; name a new or empty one, or add --force to write over it")


# Help of the options that mean the same in every command (one wording for one meaning).
COMMON_HELP = {
    "--seed": "random seed (a whole number >= 0): the same seed, the same run",
    "--seeds": "random seeds, one run each",
    "--workers": "worker processes running cells in parallel (default: one per core)",
    "--threads": "torch threads",
    "--repeats": "measured repetitions of each point",
    "--warmup": "unmeasured warm-up repetitions first",
    "--out": "where to write the result",
    "--robots": "robots in the fleet",
    "--tasks": "tasks to run",
    "--workloads": "workload names (robotserve workload list; default: all built-in ones)",
    "--dtype": "model dtype (default: the model folder's)",
    "--device": "torch device",
    "--host": "address to listen on (127.0.0.1: this machine only)",
    "--port": "TCP port to listen on",
    "--scheduler": "fleet scheduler (core/schedulers registry)",
    "--scheduler-param": "a scheduler knob KEY=VALUE (repeatable), e.g. buckets=5",
    "--max-batch": "largest batch the engine gets (default: the engine profile's saturation batch)",
    "--batch-sizes": "batch sizes to measure",
    "--report-dir": "Markdown + PNG report folder",
}


class Parser(argparse.ArgumentParser):
    """`robotserve`'s parser: one-line errors, and every option's help shows its default."""

    def error(self, message: str):  # one line naming the argument and what is allowed, no usage dump
        self.exit(2, f"{self.prog}: {message}\n")

    def format_help(self) -> str:
        for action in self._actions:  # groups add theirs past add_argument: fill them in here
            finish_help(action)
        return super().format_help()


def finish_help(action: argparse.Action) -> None:
    """An option without help takes the common one; a default not yet in its help is shown."""
    if not action.option_strings or action.help is argparse.SUPPRESS:
        return
    action.help = action.help or COMMON_HELP.get(action.option_strings[-1], "")
    h = action.help
    if not (any(action.default is x for x in (None, False, argparse.SUPPRESS)) or "%(default)" in h or "default: " in h):
        action.help = f"{h} (default: %(default)s)".lstrip()


__all__ = ["COMMON_HELP", "Parser", "finish_help", "UsageError", "between", "check_out", "comma_list", "device", "host",
           "positive", "scratch", "seed"]
