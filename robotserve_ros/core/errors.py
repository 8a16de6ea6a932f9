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


class WorkloadError(ValueError):
    """A workload file that does not follow the documented format; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"workload field '{field}': {problem}")
        self.field = field
