"""`robotserve security keystore DIR`: the SROS 2 access-control policy of the fleet, one
enclave per node, each allowed exactly the topics, services and actions that node creates
(names from the nodes' config defaults), plus the script that makes the keystore with
`ros2 security` on a ROS install whose DDS has security built in (docs/security.md). The
PyPI Fast DDS build this project tests on has DDS security compiled out: the policy is
generated and checked against the live nodes' graph (test/test_sros_policy.py), not enforced
here.

Policy format: sros2's policy.xsd, version 0.2.0 (topics publish/subscribe, services
reply/request, actions execute/call, per profile ns + node). Names are fully qualified;
DDS security matches permission names as fnmatch patterns, so `*` stands for any robot's
FetchObservation service the server may call."""
from __future__ import annotations

import importlib
import inspect
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

from .cli_types import UsageError, positive

ENCLAVE_ROOT = "/robotserve"

# What every rclpy node creates (rosout, parameter events and services, type descriptions).
_PARAM_SERVICES = ("describe_parameters", "get_parameter_types", "get_parameters", "list_parameters",
                   "set_parameters", "set_parameters_atomically", "get_type_description")
_LIFECYCLE_SERVICES = ("change_state", "get_state", "get_available_states", "get_available_transitions",
                       "get_transition_graph")


@dataclass
class Profile:
    """One node's allowances: ROS names (fully qualified) per permission kind."""

    ns: str
    node: str
    publish: set = field(default_factory=set)
    subscribe: set = field(default_factory=set)
    reply: set = field(default_factory=set)  # services it serves
    request: set = field(default_factory=set)  # services it calls
    execute: set = field(default_factory=set)  # actions it serves
    call: set = field(default_factory=set)  # actions it calls

    @property
    def fqn(self) -> str:
        return (self.ns.rstrip("/") + "/" + self.node) if self.ns != "/" else "/" + self.node

    def common(self) -> "Profile":
        self.publish |= {"/rosout", "/parameter_events"}
        self.subscribe |= {"/parameter_events", "/clock"}  # /clock: use_sim_time
        self.reply |= {f"{self.fqn}/{s}" for s in _PARAM_SERVICES}
        return self

    def managed(self) -> "Profile":
        """A lifecycle node's (nodes/managed.py): its state services and transition events."""
        self.reply |= {f"{self.fqn}/{s}" for s in _LIFECYCLE_SERVICES}
        self.publish |= {f"{self.fqn}/transition_event"}
        return self


def _service_defaults(name: str) -> dict:
    """A service's ROS names: its class's keyword defaults that are names."""
    from .nodes.services import SERVICES  # noqa: F401  (rclpy: only this command needs it)

    module, cls = {"generate": (".generate", "GenerateService"), "planner": (".planner", "PlannerService"),
                   "vlm": (".vlm", "VlmService"), "vla_language": (".vla_language", "VlaLanguageService")}[name]
    k = getattr(importlib.import_module(module, "robotserve_ros.nodes.services"), cls)
    return {n: p.default for n, p in inspect.signature(k).parameters.items()
            if isinstance(p.default, str) and p.default.startswith("/")}


def fleet_profiles(robots: list, fetch_pattern: str = "/*/robot_client/fetch_observation") -> dict:
    """Enclave path -> Profile for the server, each robot's robot_client and sim_robot, the
    planner robot and the bag recorder, with every node's default names."""
    from .nodes.bag_recorder import BagRecorderConfig
    from .nodes.planner_robot import PlannerRobotConfig
    from .nodes.robot_client import RobotClientConfig
    from .nodes.server_config import InferenceServerConfig

    from .config import defaults_of

    s, rc = InferenceServerConfig(), RobotClientConfig()
    pr, br = defaults_of(PlannerRobotConfig), defaults_of(BagRecorderConfig)  # they have required parameters
    gen, plan = _service_defaults("generate"), _service_defaults("planner")
    vlm, lang = _service_defaults("vlm"), _service_defaults("vla_language")
    server = Profile("/", "inference_server").common().managed()
    server.reply |= {s.service, gen["service"], vlm["service"], lang["generate_service"]}
    server.subscribe |= {s.progress_topic, plan["progress_topic"]}
    server.publish |= {"/diagnostics", lang["output_topic"], s.queue_topic}  # queue_topic: the wait robots re-send after
    server.request |= {fetch_pattern}  # srv/FetchObservation of whichever robot a request names
    server.execute |= {plan["action"]}
    out = {f"{ENCLAVE_ROOT}/inference_server": server}
    for r in robots:
        ns = "/" + r
        client = Profile(ns, "robot_client").common().managed()
        client.subscribe |= {f"{ns}/{t}" for t in rc.image_topics} | {f"{ns}/{rc.joint_topic}", rc.queue_topic}
        client.publish |= {f"{ns}/{rc.command_topic}", rc.progress_topic}
        client.reply |= {f"{ns}/robot_client/fetch_observation"}
        client.execute |= {f"{ns}/robot_client/run_task"}  # action/RunTask
        client.request |= {rc.service}
        out[f"{ENCLAVE_ROOT}/{r}/robot_client"] = client
        sim = Profile(ns, "sim_robot").common()
        sim.publish |= {f"{ns}/joint_states", f"{ns}/camera/image_raw", "/clock"}
        sim.subscribe |= {f"{ns}/command"}
        out[f"{ENCLAVE_ROOT}/{r}/sim_robot"] = sim
    planner = Profile("/", "planner_robot").common()
    planner.call |= {pr["action"]}
    planner.publish |= {pr["progress_topic"]}
    out[f"{ENCLAVE_ROOT}/planner_robot"] = planner
    rec = Profile("/", "bag_recorder").common()
    rec.subscribe |= set(br["topics"])
    out[f"{ENCLAVE_ROOT}/bag_recorder"] = rec
    return out


_KINDS = (("topics", "topic", "publish"), ("topics", "topic", "subscribe"), ("services", "service", "reply"),
          ("services", "service", "request"), ("actions", "action", "execute"), ("actions", "action", "call"))


def policy_xml(profiles: dict) -> str:
    root = ET.Element("policy", version="0.2.0")
    enclaves = ET.SubElement(root, "enclaves")
    for path, p in sorted(profiles.items()):
        profs = ET.SubElement(ET.SubElement(enclaves, "enclave", path=path), "profiles")
        prof = ET.SubElement(profs, "profile", ns=p.ns, node=p.node)
        for group, item, kind in _KINDS:
            names = sorted(getattr(p, kind))
            if names:
                g = ET.SubElement(prof, group, **{kind: "ALLOW"})
                for n in names:
                    ET.SubElement(g, item).text = n
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def read_policy(path) -> dict:
    """policy.xml -> enclave path -> (ns, node, {kind: set of names}): what the test checks."""
    out = {}
    for enc in ET.parse(path).getroot().iter("enclave"):
        for prof in enc.iter("profile"):
            kinds = {k: set() for _, _, k in _KINDS}
            for group, item, kind in _KINDS:
                for g in prof.findall(group):
                    if g.get(kind) == "ALLOW":
                        kinds[kind] |= {e.text for e in g.findall(item)}
            out[enc.get("path")] = (prof.get("ns"), prof.get("node"), kinds)
    return out


def keystore_script(profiles: dict) -> str:
    lines = ["#!/bin/sh",
             "# Make the fleet's SROS 2 keystore from policy.xml beside this script (robotserve security keystore).",
             "# Needs a ROS 2 install with sros2 and a DDS built with security (e.g. Fast DDS from the ROS",
             "# apt packages; the PyPI wheels this project tests with have it compiled out).",
             "set -eu", 'here=$(cd "$(dirname "$0")" && pwd)', 'keystore="${1:-$here/keystore}"',
             'command -v ros2 >/dev/null || { echo "ros2 is not installed here: see README.md" >&2; exit 2; }',
             'ros2 security create_keystore "$keystore"']
    for path in sorted(profiles):
        lines.append(f'ros2 security create_enclave "$keystore" {path}')
    for path in sorted(profiles):
        lines.append(f'ros2 security create_permission "$keystore" {path} "$here/policy.xml"')
    lines.append('echo "keystore: $keystore; run each node with ROS_SECURITY_KEYSTORE=$keystore '
                 'ROS_SECURITY_ENABLE=true ROS_SECURITY_STRATEGY=Enforce and --ros-args --enclave <its enclave>"')
    return "\n".join(lines) + "\n"


def readme(profiles: dict) -> str:
    rows = "\n".join(f"| `{p}` | `{v.fqn}` | `--ros-args --enclave {p}` |" for p, v in sorted(profiles.items()))
    return f"""# SROS 2 keystore for a robotserve_ros fleet

Generated by `robotserve security keystore`. `policy.xml` allows each node exactly the
topics, services and actions it creates (docs/security.md, "Running the fleet with SROS 2").

1. On a ROS 2 install with sros2 and a DDS built with security: `sh create_keystore.sh [KEYSTORE]`
   (default `./keystore`). Keep `keystore/private` on the machine that makes keys only; copy
   each enclave's folder (`keystore/enclaves/robotserve/...`) to the machine running that node.
2. On every machine: `export ROS_SECURITY_KEYSTORE=<keystore> ROS_SECURITY_ENABLE=true
   ROS_SECURITY_STRATEGY=Enforce` (Enforce: a node without a valid enclave does not start).
3. Start each node in its enclave:

| enclave | node | arguments |
|---|---|---|
{rows}

Robots other than those generated: `robotserve security keystore DIR --robots robot_0,robot_1,...`.
The task keys of `task_auth` (a MAC over each message) are separate from this keystore and still needed:
SROS 2 stops outsiders and eavesdroppers; the MAC stops one enrolled robot acting for another.
"""


def add_arguments(p) -> None:
    p.add_argument("dir", help="folder to write policy.xml, create_keystore.sh and README.md into")
    p.add_argument("--robots", default="robot_0", help="robot namespaces (comma-separated), an enclave each")
    p.add_argument("--count", type=positive(int), default=None,
                   help="instead of --robots: robot_0 .. robot_<count-1> (sim_robot and robot_client --robots N)")


def cli(a) -> int:
    from rclpy.validate_namespace import validate_namespace

    robots = [f"robot_{k}" for k in range(a.count)] if a.count else [r.strip() for r in a.robots.split(",")]
    for r in robots:
        try:
            validate_namespace("/" + r)
        except Exception:
            raise UsageError(f"--robots {r!r} is not a ROS namespace (letters, digits, _ and /)") from None
    d = Path(a.dir)
    if d.exists() and not d.is_dir():
        raise UsageError(f"{a.dir!r} is not a folder")
    d.mkdir(parents=True, exist_ok=True)
    profiles = fleet_profiles(robots)
    (d / "policy.xml").write_text(policy_xml(profiles))
    script = d / "create_keystore.sh"
    script.write_text(keystore_script(profiles))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (d / "README.md").write_text(readme(profiles))
    where = shutil.which("ros2")
    print(f"{d / 'policy.xml'}: {len(profiles)} enclaves; keystore: sh {script}"
          + ("" if where else " (ros2 is not on PATH here: run it where sros2 is installed)"))
    return 0 if os.path.isfile(d / "policy.xml") else 1
