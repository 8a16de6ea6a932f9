"""Errors a request can earn. Each carries a stable code the server counts and returns."""
from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses; the sender gets `code` and the message, nobody else is affected."""

    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownTask(RequestError):
    code = "unknown_task"


class RoundOutOfOrder(RequestError):
    code = "round_out_of_order"


class DuplicateRequest(RequestError):
    code = "duplicate_request"


class RoundInFlight(RequestError):
    code = "round_in_flight"


class BadExecInfo(RequestError):
    code = "bad_exec_info"


class UnknownPolicy(RequestError):
    code = "unknown_policy"


class BadPolicyParam(RequestError):
    code = "bad_policy_param"


class BadPrompt(RequestError):
    """A language request's prompt: empty, not text, over the model's context limit, or a bad
    output length (LLM plans, SLO serving, VLA language, VLM questions)."""

    code = "bad_prompt"


class BadDeadline(RequestError):
    """A time-utility function or SLO that cannot hold (beta <= 0, cutoff <= ERT, SLO <= 0, NaN)."""

    code = "bad_deadline"


class Overloaded(RequestError):
    """Refused at admission: the server takes no more of this kind of work now."""

    code = "overloaded"


class UnknownAgent(RequestError):
    code = "unknown_agent"


class WorkloadError(ValueError):
    """A workload file that does not follow the documented format; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"workload field '{field}': {problem}")
        self.field = field


class ConfigError(ValueError):
    """A configuration name or value a component cannot take (a CLI flag, a node
    parameter, a workload name): reported as one line naming it and what is allowed."""


class UnknownName(ConfigError, KeyError):
    """A name no registry entry has. Still a KeyError, for callers that look names up."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
