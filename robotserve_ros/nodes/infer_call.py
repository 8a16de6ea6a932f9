"""srv/Infer as a codec: one call decoded into a plain InferenceRequest for a fleet session,
and its response filled from the round's future (the inference server node sends it)."""
from __future__ import annotations

from ..core.errors import RequestError
from ..serve import Proof
from .common import signed_body, to_ns
from .convert import check_robot_id, check_service_name, fill_chunk, fill_status, request_from_msg


def proof_of(msg, stamp, kind: str) -> Proof:
    """A signed message's proof for the fleet's task auth: the body is serialized only when signed."""
    mac = bytes(msg.auth_mac)
    return Proof(to_ns(stamp), mac, signed_body(msg) if mac else b"", kind)


class InferCall:
    """One Infer call: decoded at once (RequestError when malformed), answered when its
    round's future is done; it holds no executor thread meanwhile (nodes/deferred.py)."""

    __slots__ = ("request", "response", "received", "req", "robot", "proof", "lang", "language_id")

    def __init__(self, request, response, received: float, spec, language) -> None:
        self.request, self.response, self.received = request, response, received
        self.req = self.lang = None
        self.language_id = ""
        self.req = request_from_msg(request, spec)
        self.robot = check_robot_id(request.robot_id, spec.max_task_id_bytes)
        check_service_name(request.refresh_service)
        self.proof = proof_of(request, request.auth_stamp, "infer")
        if request.language_prompt:  # language from this round's prefill (seed 001): the vla_language service
            if language is None:
                raise RequestError("this server decodes no language: start it with the vla_language service")
            self.lang = language
            self.language_id = language.attach(self.req, request.language_prompt, int(request.language_max_tokens))

    def answer(self, fut, now: float, joint_names, executor) -> bool:
        """Fill the response from the done future; True when it carries a chunk."""
        err, response = fut.exception(), self.response
        if err is None:
            response.language_id = self.language_id
            fill_status(response.status, "ok")
            fill_chunk(response.chunk, fut.result(), int(self.request.observation.timestep), now, joint_names)
            return True
        if self.language_id:  # off the fleet's lock: the language service takes its own (an executor thread)
            if executor is not None:
                executor.create_task(self.lang.cancel, self.req, self.language_id)
            else:
                self.lang.cancel(self.req, self.language_id)
        fill_status(response.status, getattr(err, "code", "internal"), getattr(err, "message", repr(err)))
        return False
