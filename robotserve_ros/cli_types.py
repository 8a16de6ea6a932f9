"""Command-line value types and the one-line usage error, shared by the CLI and every command
module that defines its own options. The lowest floor: imports nothing of the package, so a
module anywhere may take `positive` without importing the CLI above it."""
from __future__ import annotations

import argparse
import math


class UsageError(Exception):
    """A wrong name or value on the command line: one line to stderr, exit 2."""


def positive(kind=float, zero_ok: bool = False):
    """argparse type: a finite number > 0 (>= 0 with zero_ok; a whole one for kind=int)."""
    def parse(v: str):
        try:
            x = kind(v)
        except ValueError:
            x = None
        if x is None or not math.isfinite(x) or x < 0 or (x == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(
                f"must be a {'whole ' if kind is int else ''}number {'>= 0' if zero_ok else '> 0'}, got {v!r}")
        return x

    return parse


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


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the argument and what is allowed, no usage dump
        self.exit(2, f"{self.prog}: {message}\n")


__all__ = ["Parser", "UsageError", "comma_list", "positive", "seed"]
