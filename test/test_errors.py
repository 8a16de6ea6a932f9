"""Request errors: every code a refusal can carry is a msg/Status constant (its name in snake
case), so a sender always gets a code it can read, never INTERNAL by a typo."""
import importlib
import pkgutil
from pathlib import Path

import robotserve_ros
from robotserve_ros.core import errors
from robotserve_ros.core.errors import RequestError

STATUS_MSG = Path(__file__).resolve().parents[1] / "msg" / "Status.msg"


def status_names():
    names = set()
    for line in STATUS_MSG.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "=" in line:
            names.add(line.split("=")[0].split()[-1].lower())
    return names


def all_subclasses(cls):
    for c in cls.__subclasses__():
        yield c
        yield from all_subclasses(c)


def test_codes_follow_the_class_names_and_msg_status():
    assert errors.UnknownTask.code == "unknown_task"
    assert errors.RoundOutOfOrder.code == "round_out_of_order"
    assert errors.BadPolicyParam.code == "bad_policy_param"
    assert RequestError("x").code == "bad_request"


def test_every_request_error_in_the_core_has_a_status_constant():
    for m in pkgutil.walk_packages(robotserve_ros.core.__path__, "robotserve_ros.core."):
        importlib.import_module(m.name)
    known = status_names()
    assert {"unknown_task", "overloaded", "bad_request"} <= known
    # only the core's: transports (gRPC, LeRobot) subclass it for their own refusals, which
    # travel in their own protocol's status, not msg/Status; and which are imported depends on test order
    missing = {c.__name__: c.code for c in all_subclasses(RequestError)
               if c.__module__.startswith("robotserve_ros.core") and c.code not in known}
    assert not missing, missing


def test_a_subclass_keeps_its_own_code_and_a_deeper_one_inherits():
    class NoFrame(RequestError):
        code = "bad_observation"

    class LateFrame(errors.Overloaded):
        pass

    assert NoFrame.code == "bad_observation" and LateFrame.code == "overloaded"
