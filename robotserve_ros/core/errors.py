"""Errors a request can earn. Each carries a stable code the server counts and returns."""
from __future__ import annotations

import re
from typing import Optional


class RequestError(Exception):
    """A request the server refuses; the sender gets `code` and the message, nobody else is affected."""

    code = "bad_request"

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        # A direct subclass's code is its name in snake case (UnknownTask -> unknown_task), as
        # msg/Status names its constants, unless it sets its own; deeper ones inherit theirs.
        if "code" not in cls.__dict__ and RequestError in cls.__bases__:
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownTask(RequestError):
    """A task not started with round 0, finished, or reaped."""


class RoundOutOfOrder(RequestError):
    """A round id that went backwards (or is not an integer >= 0)."""


class DuplicateRequest(RequestError):
    """A round already received (and its reply gone)."""


class RoundInFlight(RequestError):
    """The task's previous round is still being generated."""


class StaleObservation(RequestError):
    """The round's observation was older than its maximum age when its batch began, and no
    fresher one came: it is not generated from it (the robot sends the round again)."""


class BadExecInfo(RequestError):
    """Missing, NaN or negative execution info (phase start, actions left, control rate)."""


class UnknownPolicy(RequestError):
    """A horizon policy not registered."""


class BadPolicyParam(RequestError):
    """A client's horizon knob out of the policy's range."""


class BadPrompt(RequestError):
    """A language request's prompt: empty, not text, over the model's context limit, or a bad
    output length (LLM plans, SLO serving, VLA language, VLM questions)."""


class BadDeadline(RequestError):
    """A time-utility function or SLO that cannot hold (beta <= 0, cutoff <= ERT, SLO <= 0, NaN)."""


class BadRtc(RequestError):
    """A real-time chunking leftover the policy cannot inpaint: wrong width, not finite, longer
    than a chunk, or without the execution info (control rate) its delay is predicted from."""


class Overloaded(RequestError):
    """Refused at admission: the server takes no more of this kind of work now."""


class UnknownAgent(RequestError):
    """An agent kind or id the server does not serve."""


class WorkloadError(ValueError):
    """A workload file that does not follow the documented format; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"workload field '{field}': {problem}")
        self.field = field


class ConfigError(ValueError):
    """A configuration name or value a component cannot take (a CLI flag, a node
    parameter, a workload name): reported as one line naming it and what is allowed.

    ConfigError(line), or ConfigError(name, what): `parameter 'engine.name': 'x' is not one
    of ...`, the dotted name and what is wrong; `under(prefix)` puts it inside a section."""

    def __init__(self, name: str, what: Optional[str] = None) -> None:
        super().__init__(name if what is None else f"parameter '{name}': {what}")  # one argument: the whole line
        self.name, self.what = (name, what) if what is not None else ("", None)

    def under(self, prefix: str) -> "ConfigError":
        """The same error, its name inside the section `prefix`."""
        if self.what is None or not prefix:
            return self
        return ConfigError(f"{prefix}.{self.name}", self.what)


class UnknownName(ConfigError, KeyError):
    """A name no registry entry has. Still a KeyError, for callers that look names up."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
