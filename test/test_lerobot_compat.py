"""LeRobot async-inference compatibility: the allow-list unpickler, the gRPC endpoint, and
LeRobot's own RobotClient (unmodified, as a subprocess) driving a fake plugin robot."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from robotserve_ros.engines import ENGINES

grpc = pytest.importorskip("grpc")
pytest.importorskip("lerobot")

from robotserve_ros.engines.torch_env import import_lerobot_policies, import_torch  # noqa: E402

import_lerobot_policies()
torch = import_torch()

from lerobot.async_inference.helpers import RemotePolicyConfig, TimedAction, TimedObservation  # noqa: E402
from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.transport import services_pb2 as pb  # noqa: E402
from lerobot.transport import services_pb2_grpc as pb_grpc  # noqa: E402
from lerobot.transport.utils import send_bytes_in_chunks  # noqa: E402

from robotserve_ros.transport import safe_pickle  # noqa: E402
from robotserve_ros.transport.lerobot.config import CompatConfig  # noqa: E402
from rosutil import REPO_ROOT  # noqa: E402
from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
from robotserve_ros.live import mixed  # noqa: E402 (the fake robot plugin; bench mixed-fleet uses it too)
JOINTS = [f"j{i}.pos" for i in range(6)]
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (6,), "names": JOINTS},
    "observation.images.cam0": {"dtype": "image", "shape": (24, 40, 3), "names": ["height", "width", "channels"]},
}


# --- payloads ------------------------------------------------------------------------------
def timed_obs(step: int, q=None, must_go: bool = True, stamp: float | None = None) -> TimedObservation:
    q = np.arange(6) * 0.1 if q is None else q
    raw = {n: float(v) for n, v in zip(JOINTS, q)}
    raw["cam0"] = np.full((24, 40, 3), step % 256, np.uint8)
    raw["task"] = "pick up the cube"
    return TimedObservation(timestamp=time.time() if stamp is None else stamp, timestep=step, observation=raw,
                            must_go=must_go)


def policy_setup(path="/policies/dp", ptype="diffusion", apc=4) -> pb.PolicySetup:
    return pb.PolicySetup(data=pickle.dumps(RemotePolicyConfig(ptype, str(path), FEATURES, apc, "cpu")))


class _Reduce:
    """An object whose unpickling would call fn(*args)."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def malicious(kind: str, marker: Path) -> bytes:
    """A pickle that touches `marker` if anything in it runs."""
    if kind == "os.system":
        return pickle.dumps(_Reduce(os.system, f"touch {marker}"))
    if kind == "builtins.eval":
        return pickle.dumps(_Reduce(eval, f"open({str(marker)!r}, 'w').close()"))
    if kind == "subprocess.Popen":
        return pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(marker)]))
    # hidden inside an otherwise valid observation
    obs = timed_obs(0)
    obs.observation["task"] = _Reduce(os.system, f"touch {marker}")
    return pickle.dumps(obs)


MALICIOUS = ["os.system", "builtins.eval", "subprocess.Popen", "nested"]
GLOBAL_NAMED = {"os.system": "posix.system", "builtins.eval": "builtins.eval",
                "subprocess.Popen": "subprocess.Popen", "nested": "posix.system"}


# --- in-process server and stubs ------------------------------------------------------------
@pytest.fixture
def sim_server():
    """The compat server on a free port with the profile-driven stand-in engine (no model)."""
    cfg = CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 5.0, 4: 8.0},
                       get_actions_timeout_s=1.0, keep_trace=True, max_payload_bytes=1 << 20,
                       policy_dirs=("/policies",))
    srv = LeRobotCompatServer(cfg)
    yield srv
    srv.stop(0)


class Client:
    """One gRPC connection = one peer = one LeRobot client, as robot_client.py connects from
    its own process (channels in one process otherwise share a connection, hence one peer)."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        self.stub = pb_grpc.AsyncInferenceStub(self.channel)

    def start(self, **setup) -> None:
        self.stub.Ready(pb.Empty())
        self.stub.SendPolicyInstructions(policy_setup(**setup))

    def send(self, obs_or_bytes) -> None:
        data = obs_or_bytes if isinstance(obs_or_bytes, bytes) else pickle.dumps(obs_or_bytes)
        self.stub.SendObservations(send_bytes_in_chunks(data, pb.Observation, silent=True))

    def actions(self) -> list:
        reply = self.stub.GetActions(pb.Empty())
        return pickle.loads(reply.data) if reply.data else []

    def close(self) -> None:
        self.channel.close()


def _refused(call, code) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, e.value.details()
    return e.value.details()


# --- the allow-list unpickler ------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_allowed_payloads_round_trip(protocol):
    obs = timed_obs(7, must_go=False)
    back = safe_pickle.loads(pickle.dumps(obs, protocol=protocol))
    assert isinstance(back, TimedObservation) and back.timestep == 7 and back.must_go is False
    assert back.observation["j3.pos"] == obs.observation["j3.pos"]
    assert np.array_equal(back.observation["cam0"], obs.observation["cam0"])
    # the server only reads what LeRobot's client sends: never TimedActions or tensors
    acts = [TimedAction(timestamp=1.5, timestep=i, action=torch.arange(6, dtype=torch.float32) * i) for i in range(3)]
    with pytest.raises(safe_pickle.UnsafePickle, match="TimedAction"):
        safe_pickle.loads(pickle.dumps(acts, protocol=protocol))
    cfg = RemotePolicyConfig("act", "/p", {"x": PolicyFeature(FeatureType.VISUAL, (3, 8, 8)), **FEATURES}, 5, "cpu",
                             {"a": "b"})
    assert safe_pickle.loads(pickle.dumps(cfg, protocol=protocol)) == cfg


@pytest.mark.parametrize("kind", MALICIOUS)
def test_unpickler_refuses_other_globals_and_runs_nothing(kind, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(safe_pickle.UnsafePickle, match=GLOBAL_NAMED[kind].replace(".", r"\.")):
        safe_pickle.loads(malicious(kind, marker))
    assert not marker.exists()


def test_unpickler_refuses_unlisted_names_of_allowed_modules_and_garbage():
    # the module holds allowed classes, but get_logger is not one of them
    bad = pickle.dumps(_Reduce(__import__("lerobot.async_inference.helpers", fromlist=["_"]).get_logger, "x"))
    with pytest.raises(safe_pickle.UnsafePickle, match="helpers.get_logger"):
        safe_pickle.loads(bad)
    with pytest.raises(safe_pickle.UnsafePickle, match="_codecs.encode: only a string with encoding 'latin1'"):
        safe_pickle.loads(b"c_codecs\nencode\n(Vabc\nVrot13\ntR.")
    with pytest.raises(safe_pickle.UnsafePickle, match="truncated"):
        safe_pickle.loads(pickle.dumps(timed_obs(1))[:-20])
    with pytest.raises(safe_pickle.UnsafePickle, match="not a valid LeRobot pickle"):
        safe_pickle.loads(b"\x80\x04\x8c\x02\xff\xfe.")  # not UTF-8
    with pytest.raises(safe_pickle.PayloadTooLarge):
        safe_pickle.loads(b"x" * 101, max_bytes=100)


# --- the endpoint ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MALICIOUS)
@pytest.mark.parametrize("rpc", ["SendPolicyInstructions", "SendObservations"])
def test_malicious_pickle_rejected_at_endpoint(sim_server, tmp_path, rpc, kind):
    marker = tmp_path / "pwned"
    c = Client(sim_server.port)
    c.start()
    data = malicious(kind, marker)
    if rpc == "SendPolicyInstructions":
        call = lambda: c.stub.SendPolicyInstructions(pb.PolicySetup(data=data))  # noqa: E731
    else:
        call = lambda: c.send(data)  # noqa: E731
    details = _refused(call, grpc.StatusCode.INVALID_ARGUMENT)
    assert GLOBAL_NAMED[kind] in details
    assert not marker.exists()
    assert sim_server.servicer.stats()["protocol_errors"] == {"unsafe_pickle": 1}
    # nothing else lost: the same client is still served
    if rpc == "SendPolicyInstructions":
        c.stub.SendPolicyInstructions(policy_setup())
    c.send(timed_obs(0))
    assert len(c.actions()) == 4
    c.close()


def test_oversized_and_malformed_transfers_refused(sim_server):
    c = Client(sim_server.port)
    c.start()
    big = [pb.Observation(transfer_state=pb.TRANSFER_BEGIN, data=b"x" * (600 << 10)),
           pb.Observation(transfer_state=pb.TRANSFER_END, data=b"x" * (600 << 10))]
    _refused(lambda: c.stub.SendObservations(iter(big)), grpc.StatusCode.RESOURCE_EXHAUSTED)
    cut = [pb.Observation(transfer_state=pb.TRANSFER_BEGIN, data=pickle.dumps(timed_obs(0)))]
    assert "TRANSFER_END" in _refused(lambda: c.stub.SendObservations(iter(cut)), grpc.StatusCode.INVALID_ARGUMENT)
    wrong = pickle.dumps(RemotePolicyConfig("act", "/p", FEATURES, 4))
    assert "expected a pickled TimedObservation" in _refused(lambda: c.send(wrong), grpc.StatusCode.INVALID_ARGUMENT)
    obs = timed_obs(0)
    del obs.observation["j2.pos"]
    assert "'j2.pos' missing" in _refused(lambda: c.send(obs), grpc.StatusCode.INVALID_ARGUMENT)
    obs = timed_obs(0)
    obs.observation["cam0"] = obs.observation["cam0"].astype(np.float32)
    assert "uint8" in _refused(lambda: c.send(obs), grpc.StatusCode.INVALID_ARGUMENT)
    st = sim_server.servicer.stats()
    # refused before a request existed: the endpoint's count; a malformed observation of the
    # client's task: its policy's core counts it, once
    assert st["protocol_errors"] == {"payload_too_large": 1, "bad_transfer": 1, "bad_payload": 1}
    (pol,) = st["policies"].values()
    assert pol["errors"] == {"bad_observation": 2}
    stranger = Client(sim_server.port)  # never said Ready
    _refused(lambda: stranger.send(timed_obs(0)), grpc.StatusCode.FAILED_PRECONDITION)
    _refused(lambda: stranger.stub.GetActions(pb.Empty()), grpc.StatusCode.FAILED_PRECONDITION)
    c.close()
    stranger.close()


def test_an_upload_the_client_cancels_is_abandoned_never_a_bad_transfer(sim_server):
    """A client that stops mid-upload (LeRobot's RobotClient closing its channel) is its own doing:
    counted as abandoned, not refused as a bad transfer, even when the cancel reaches the read as
    the stream's end before grpc marks the call cancelled (it did in about one upload in ten)."""
    import threading

    piece = pb.Observation(transfer_state=pb.TRANSFER_BEGIN, data=pickle.dumps(timed_obs(0))[:100])
    for i in range(30):
        c = Client(sim_server.port)
        c.start()
        hold = threading.Event()

        def pieces():  # the first piece, then the client stops before the last
            yield piece
            hold.wait(2)

        call = c.stub.SendObservations.future(pieces())
        time.sleep(0.02 + 0.001 * (i % 10))
        c.close() if i % 2 else call.cancel()
        hold.set()
    deadline = time.time() + 5
    while sim_server.servicer.stats()["uploads_abandoned"] < 30 and time.time() < deadline:
        time.sleep(0.05)
    st = sim_server.servicer.stats()
    assert st["uploads_abandoned"] == 30 and "bad_transfer" not in st["protocol_errors"]


def test_policy_instructions_checked(sim_server):
    c = Client(sim_server.port)
    c.stub.Ready(pb.Empty())
    assert "outside" in _refused(lambda: c.stub.SendPolicyInstructions(policy_setup(path="/etc/dp")),
                                 grpc.StatusCode.PERMISSION_DENIED)
    assert "not one LeRobot" in _refused(lambda: c.stub.SendPolicyInstructions(policy_setup(ptype="nope")),
                                         grpc.StatusCode.INVALID_ARGUMENT)
    assert "actions_per_chunk" in _refused(lambda: c.stub.SendPolicyInstructions(policy_setup(apc=0)),
                                           grpc.StatusCode.INVALID_ARGUMENT)
    c.close()


def test_two_clients_are_two_tasks_with_lerobot_timing(sim_server):
    srv = sim_server.servicer
    a, b = Client(sim_server.port), Client(sim_server.port)
    a.start()
    b.start(apc=6)
    t0 = time.time()
    a.send(timed_obs(0, stamp=t0))
    b.send(timed_obs(3, stamp=t0))
    ca, cb = a.actions(), b.actions()
    # LeRobot's server timing: action i at obs timestep + i, obs timestamp + i / fps
    assert [x.timestep for x in ca] == [0, 1, 2, 3] and [x.timestep for x in cb] == list(range(3, 9))
    assert [x.timestamp for x in ca] == pytest.approx([t0 + i / 30.0 for i in range(4)])
    assert all(isinstance(x.action, torch.Tensor) and x.action.shape == (6,) for x in ca + cb)
    st = srv.stats()
    assert len(st["clients"]) == 2 and len(st["policies"]) == 1
    (pol,) = st["policies"].values()
    assert pol["tasks"] == 2 and pol["served"] == 2
    task_a, task_b = (owner(sim_server, np.stack([x.action.numpy() for x in c])) for c in (ca, cb))
    assert task_a != task_b

    # The robot executed two of its four actions: the next round carries that as exec info.
    core = next(iter(srv.groups.values())).core
    a.send(timed_obs(2, q=np.ones(6) * 5))
    assert [x.timestep for x in a.actions()] == [2, 3, 4, 5]
    rec = core.ledger.tasks[task_a]
    assert rec.rounds == 2 and rec.execs[0] is not None
    # 3 - 2 = 1 action still queued at 30 Hz when round 1 was sent
    assert rec.execs[0].end - rec.gens[1].start == pytest.approx(1 / 30.0, abs=0.02)
    # LeRobot's filter: a timestep already predicted, not must_go, is skipped
    a.send(timed_obs(2, q=np.ones(6) * 9, must_go=False))
    assert srv.stats()["clients"][task_a]["filtered"] == 1 and rec.rounds == 2
    # Ready again restarts the task: a new task id, the old one leaves the scheduler
    a.stub.Ready(pb.Empty())
    assert task_a not in core.ledger.tasks
    a.close()
    b.close()


class _FailsOnce:
    """An engine whose first batch fails (a driver fault, a lost GPU), then serves."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, 0

    def infer(self, batch):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("device lost")
        return self.engine.infer(batch)


def test_engine_failure_requeued_by_the_runner_and_the_client_still_served(sim_server):
    srv = sim_server.servicer
    c = Client(sim_server.port)
    c.start()
    (g,) = srv.groups.values()
    flaky = g.runner.engines["edge"] = _FailsOnce(g.engine)
    c.send(timed_obs(3))
    acts = c.actions()
    assert [a.timestep for a in acts] == [3, 4, 5, 6] and flaky.calls == 2
    st = srv.stats()
    (pol,) = st["policies"].values()
    # counted once, by the core: the batch went back to the queue and was served on the retry
    assert pol["errors"] == {"engine_failure": 1} and pol["engine_failures"] == 1
    assert pol["requeued"] == 1 and pol["served"] == 1 and st["protocol_errors"] == {}
    assert g.core.tiers[0].busy == 0  # the cooldown ended: the slot is free again
    c.close()


def test_stale_observation_served_from_the_clients_newest():
    """A round queued past stale_obs_s is served from the newest observation the client sent
    meanwhile (one the similarity filter skipped), its chunk timed from that one."""
    cfg = CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 300.0},
                       get_actions_timeout_s=5.0, stale_obs_s=0.5, policy_dirs=("/policies",))
    server = LeRobotCompatServer(cfg)
    srv = server.servicer
    a, b = Client(server.port), Client(server.port)
    try:
        a.start()
        b.start()
        (g,) = srv.groups.values()
        a.send(timed_obs(0))
        end = time.monotonic() + 10
        while not g.core.inflight and time.monotonic() < end:  # a's round holds the only slot
            time.sleep(0.01)
        assert g.core.inflight
        b.send(timed_obs(10, stamp=time.time() - 10))  # queued behind a's, already old
        b.send(timed_obs(11, must_go=False))  # the same joints: LeRobot's filter skips it
        (task_b,) = [t for t, v in srv.stats()["clients"].items() if v["filtered"] == 1]
        assert [x.timestep for x in b.actions()] == [11, 12, 13, 14]
        assert [x.timestep for x in a.actions()] == [0, 1, 2, 3]
        st = srv.stats()
        (pol,) = st["policies"].values()
        assert pol["refreshes"] == 1 and pol["refresh_failures"] == 0 and st["clients"][task_b]["refreshed"] == 1
        # ages are recorded at dispatch: b's was its newest observation's, not the queued one's (>= 5 s)
        assert 0 < pol["obs_age_max_s"] < 4.0 and pol["obs_age_mean_s"] > 0
        b.send(timed_obs(11, q=np.ones(6), must_go=False))  # timestep 11 now counts as predicted
        assert srv.stats()["clients"][task_b]["filtered"] == 2
    finally:
        a.close()
        b.close()
        server.stop(0)


@pytest.mark.parametrize("replan_held", [False, True])
@pytest.mark.parametrize("must_go", [False, True])
def test_observation_held_while_generating_is_answered_by_its_chunk(replan_held, must_go):
    """RobotClient sends an observation every tick while its queue is at its threshold; one that
    arrives while its chunk generates was sent before the robot had that chunk. robotserve: the
    chunk answers it (counted, not predicted); replan_held: predicted next, as LeRobot's server does.
    Either way the robot's next observation is served: nothing stalls."""
    cfg = CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 300.0},
                       get_actions_timeout_s=5.0, policy_dirs=("/policies",), replan_held=replan_held)
    server = LeRobotCompatServer(cfg)
    srv = server.servicer
    a = Client(server.port)
    try:
        a.start()
        (g,) = srv.groups.values()
        a.send(timed_obs(0))
        end = time.monotonic() + 10
        while not g.core.inflight and time.monotonic() < end:
            time.sleep(0.01)
        assert g.core.inflight
        a.send(timed_obs(2, q=np.ones(6) * 5, must_go=must_go))  # its queue at the threshold: it asks again
        assert [x.timestep for x in a.actions()] == [0, 1, 2, 3]
        (task,) = srv.stats()["clients"]
        rec = g.core.ledger.tasks[task]
        counts = srv.stats()["clients"][task]
        if replan_held:  # LeRobot's behaviour: the held one is the next round
            assert counts["answered"] == 0 and counts["rounds"] == 2
            assert [x.timestep for x in a.actions()] == [2, 3, 4, 5]
        else:
            assert counts["answered"] == 1 and counts["rounds"] == 1
            assert not g.core.inflight and task not in g.core.pending and rec.rounds == 1
        # the robot's queue runs down to the threshold again: its next observation is served
        a.send(timed_obs(4, q=np.ones(6) * 7, must_go=False))
        assert [x.timestep for x in a.actions()] == [4, 5, 6, 7]
        assert srv.stats()["clients"][task]["rounds"] == (3 if replan_held else 2)
    finally:
        a.close()
        server.stop(0)


def test_issued_sessions_separate_clients_on_one_connection(sim_server):
    """Two robots on one connection: each asks Ready for a new session and names the id the
    server issued (Ready's initial metadata) on its calls; each is its own task."""
    ch = grpc.insecure_channel(f"127.0.0.1:{sim_server.port}")
    stub = pb_grpc.AsyncInferenceStub(ch)
    sids = []
    for _ in ("left-arm", "right-arm"):
        _, call = stub.Ready.with_call(pb.Empty(), metadata=[("robotserve-session", "new")])
        (sid,) = [v for k, v in call.initial_metadata() if k == "robotserve-session"]
        md = [("robotserve-session", sid)]
        stub.SendPolicyInstructions(policy_setup(), metadata=md)
        stub.SendObservations(send_bytes_in_chunks(pickle.dumps(timed_obs(0)), pb.Observation), metadata=md)
        assert len(pickle.loads(stub.GetActions(pb.Empty(), metadata=md).data)) == 4
        sids.append(sid)
    assert len(set(sids)) == 2 and all(len(s) >= 24 for s in sids)
    assert len(sim_server.servicer.stats()["clients"]) == 2
    ch.close()


@pytest.mark.parametrize("field,value,says", [
    ("fps", -1, "fps must be a number > 0, got -1"),
    ("scheduler", "nosuch", "parameter 'scheduler': 'nosuch' is not one of autellix, edf, fifo, kairos"),
    ("scheduler_params", {"nosuch": 1}, "parameter 'scheduler_params.nosuch': given 1, but scheduler 'remaining' has no such knob"),
    ("engine", "nosuch", f"parameter 'engine': 'nosuch' is not one of {', '.join(ENGINES.names())}"),
    ("profile_ms", {0: 5.0}, "parameter 'profile_ms': [0] is not a list of increasing batch sizes starting at 1"),
    ("port", 70000, "port must be an integer in 0..65535"),
    ("threads", 0, "threads must be an integer > 0"),
    ("stale_obs_s", -0.5, "stale_obs_s must be a number >= 0"),
    ("replan_held", "yes", "replan_held must be true or false"),
    ("policy_dirs", "/policies", "policy_dirs must be a sequence"),
])
def test_config_checked_when_made(field, value, says):
    with pytest.raises(ValueError) as e:
        CompatConfig(**{field: value})
    assert says in str(e.value)
    cfg = CompatConfig(policy_dirs=["/policies"])
    assert cfg.policy_dirs == ("/policies",)
    with pytest.raises(AttributeError):
        cfg.fps = 10.0  # frozen: what was checked stays so


def test_cli_refuses_a_policy_dir_that_is_not_there_before_serving(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "lerobot-server", "--port", "0",
                          "--policy-dir", str(tmp_path / "nonexistent")], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"robotserve lerobot-server: --policy-dir '{tmp_path / 'nonexistent'}' is not a directory "
        "(policies load only from under existing ones)"]
    assert "serving" not in bad.stdout


def test_cli_serves_until_sigterm(tmp_path):
    import signal

    bad = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "lerobot-server", "--scheduler", "nope"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'nope' is not one of" in bad.stderr and "kairos" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1  # one line, no traceback
    (tmp_path / "policies").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "robotserve_ros.cli", "lerobot-server", "--port", "0", "--engine",
                          "simulated", "--engine-param", "chunk_size=6", "--latency-ms", "1:5,2:6",
                          "--policy-dir", str(tmp_path / "policies")], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        port = int(line.split(" on ")[1].split()[0].rpartition(":")[2])
        c = Client(port)
        c.start(apc=6, path=str(tmp_path / "policies" / "dp"))
        c.send(timed_obs(5))
        assert [a.timestep for a in c.actions()] == list(range(5, 11))
        c.close()
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    finally:
        p.kill()
        p.wait(10)


# --- LeRobot's own RobotClient, unmodified, end to end --------------------------------------------
@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    from lerobot_policies import make_policy_dir

    root = tmp_path_factory.mktemp("policies")
    return {"diffusion": make_policy_dir("diffusion", root / "dp", n_obs_steps=2),
            "act": make_policy_dir("act", root / "act")}


@pytest.fixture(scope="module")
def lerobot_server(policies):
    cfg = CompatConfig(port=0, engine="lerobot", scheduler="kairos", keep_trace=True, client_timeout_s=2.0,
                       policy_dirs=(str(Path(policies["act"]).parent),))
    srv = LeRobotCompatServer(cfg)
    for kind, path in policies.items():  # load now, so the clients' timing starts warm
        srv.servicer.policies.get(kind, str(path), 6)
    yield srv
    srv.stop(0)


def start_robot_client(tmp_path: Path, i: int, port: int, kind: str, path: Path) -> tuple:
    return mixed.start_robot_client(tmp_path, i, port, kind, path)


executed = mixed.executed


def run_clients(srv, tmp_path, kinds: list, policies, want: int = 20, timeout: float = 60.0) -> list:
    """Run LeRobot robot_clients until each executed `want` actions (or `timeout`: a cold
    start of LeRobot on a loaded 2-core machine alone can take half a minute)."""
    procs = [start_robot_client(tmp_path, i, srv.port, k, policies[k]) for i, k in enumerate(kinds)]
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end and min(len(executed(r)) for _, r in procs) < want:
            for p, _ in procs:
                assert p.poll() is None, (tmp_path / "robot0.log").read_text()[-3000:]
            time.sleep(0.25)
        return [executed(r) for _, r in procs]
    finally:
        for p, _ in procs:
            p.kill()
            p.wait(10)


def owner(srv, actions: np.ndarray) -> str:
    """The task whose delivered chunks hold every action the robot executed."""
    st = srv.servicer.stats()["clients"]
    owners = [t for t in st if (tr := srv.servicer.trace(t)) and
              all(np.isclose(np.array(tr), a, atol=1e-6).all(1).any() for a in actions)]
    assert len(owners) == 1, f"executed actions match {len(owners)} tasks' chunks"
    return owners[0]


def test_robot_client_two_diffusion_robots_are_two_tasks(lerobot_server, policies, tmp_path):
    done = run_clients(lerobot_server, tmp_path, ["diffusion", "diffusion"], policies)
    for acts in done:
        assert len(acts) >= 20 and np.all(np.isfinite(acts))
        assert np.ptp(acts, axis=0).max() > 0.1  # the policy's actions, not a constant
    assert list((tmp_path / "logs").glob("robot_client_*")), "LeRobot's client logs where it was started"
    tasks = {owner(lerobot_server, a) for a in done}
    assert len(tasks) == 2  # one task per client, each robot got only its own chunks
    st = lerobot_server.servicer.stats()
    print(json.dumps(st, indent=1))
    pol = st["policies"][f"diffusion:{Path(policies['diffusion']).resolve()}"]
    assert pol["served"] >= 10 and not pol["errors"] and not pol["engine_failures"] and not st["protocol_errors"]
    # both are tasks of the one scheduler that serves that policy (batched together when they meet)
    core = lerobot_server.servicer.groups[("diffusion", str(Path(policies["diffusion"]).resolve()))].core
    assert tasks <= set(core.ledger.tasks)
    # Killed clients say nothing: their tasks are reaped after client_timeout_s
    end = time.monotonic() + 6
    while time.monotonic() < end and any(t in lerobot_server.servicer.stats()["clients"] for t in tasks):
        time.sleep(0.25)
    assert not tasks & set(lerobot_server.servicer.stats()["clients"])


def test_robot_client_act(lerobot_server, policies, tmp_path):
    (acts,) = run_clients(lerobot_server, tmp_path, ["act"], policies)
    assert len(acts) >= 20 and np.all(np.isfinite(acts))
    owner(lerobot_server, acts)


def test_policy_checked_against_the_checkpoint(lerobot_server, policies):
    c = Client(lerobot_server.port)
    c.stub.Ready(pb.Empty())
    assert "holds a 'diffusion' policy" in _refused(
        lambda: c.stub.SendPolicyInstructions(policy_setup(policies["diffusion"], ptype="act")),
        grpc.StatusCode.INVALID_ARGUMENT)
    # the robot calls its camera "front"; the policy's is "cam0": refused, then mapped by rename_map
    feats = {"observation.state": FEATURES["observation.state"],
             "observation.images.front": FEATURES["observation.images.cam0"]}
    spec = RemotePolicyConfig("act", str(policies["act"]), feats, 3)
    assert "rename_map" in _refused(lambda: c.stub.SendPolicyInstructions(pb.PolicySetup(data=pickle.dumps(spec))),
                                    grpc.StatusCode.INVALID_ARGUMENT)
    spec.rename_map = {"observation.images.front": "observation.images.cam0"}
    c.stub.SendPolicyInstructions(pb.PolicySetup(data=pickle.dumps(spec)))
    obs = timed_obs(4)
    obs.observation["front"] = obs.observation.pop("cam0")  # 24x40: resized to the policy's 32x32
    c.send(obs)
    acts = c.actions()
    assert [a.timestep for a in acts] == [4, 5, 6] and all(torch.isfinite(a.action).all() for a in acts)
    c.close()
