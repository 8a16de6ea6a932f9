"""Policy sources (transport/policy_source.py): hub ids from an allow-list resolved offline
through a hub cache the test lays out itself (models--org--name/snapshots/REV, refs/main, a
policy saved with save_pretrained), safetensors only, the revision pinned; local paths
resolved with realpath before the containment check, one answer for outside and missing."""
from __future__ import annotations

import os

import numpy as np
import pytest

from robotserve_ros.transport.tensors import shown
from robotserve_ros.transport import policy_source
from robotserve_ros.transport.policy_source import PolicySourceError, hub_patterns, resolve_policy

REV = "0123456789abcdef0123456789abcdef01234567"


def lay_out(cache, hub_id: str, files: dict | None = None):
    """A hub-cache entry as huggingface_hub writes one; returns its snapshot folder."""
    org, name = hub_id.split("/")
    repo = cache / f"models--{org}--{name}"
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    for fname, data in (files or {}).items():
        (snap / fname).write_bytes(data)
    return snap


def _weights() -> bytes:
    from safetensors.numpy import save

    return save({"w": np.zeros(4, np.float32)})


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing from the network, whatever the test asks
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(policy_source, "HUB", policy_source.HubResolutions())  # each test its own budget
    return cache


def test_hub_id_resolves_offline_and_is_pinned(offline_cache, caplog):
    snap = lay_out(offline_cache, "lerobot/tiny", {"config.json": b"{}", "model.safetensors": _weights()})
    caplog.set_level("INFO", "robotserve.policy_source")
    src = resolve_policy("lerobot/tiny", allow_hub=("lerobot/*",))
    assert src.path == os.path.realpath(snap) and src.hub_id == "lerobot/tiny" and src.revision == REV
    assert REV in caplog.text and "lerobot/tiny" in caplog.text


def test_hub_id_not_allowed_is_the_one_refusal(offline_cache):
    lay_out(offline_cache, "evil/tiny", {"model.safetensors": _weights()})
    with pytest.raises(PolicySourceError) as e:
        resolve_policy("evil/tiny", allow_hub=("lerobot/*",))
    assert e.value.code == "policy_not_allowed"


def test_hub_id_not_in_the_offline_cache(offline_cache):
    with pytest.raises(PolicySourceError) as e:
        resolve_policy("lerobot/absent", allow_hub=("lerobot/*",))
    assert e.value.code == "hub_unavailable" and "HF_HUB_OFFLINE" in e.value.message


@pytest.mark.parametrize("pickle_name", ["pytorch_model.bin", "model.pt", "sub/extra.pkl"])
def test_pickle_checkpoints_are_refused(offline_cache, pickle_name):
    snap = lay_out(offline_cache, "lerobot/pickled", {"model.safetensors": _weights()})
    (snap / pickle_name).parent.mkdir(exist_ok=True)
    (snap / pickle_name).write_bytes(b"\x80\x04N.")
    with pytest.raises(PolicySourceError) as e:
        resolve_policy("lerobot/pickled", allow_hub=("lerobot/*",))
    assert e.value.code == "not_safetensors"


def test_outside_and_missing_get_one_answer(tmp_path):
    allowed = tmp_path / "policies"
    (allowed / "good").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (allowed / "link").symlink_to(tmp_path / "secret")  # inside by name, outside by realpath
    assert resolve_policy(str(allowed / "good"), (str(allowed),)).path == os.path.realpath(allowed / "good")
    answers = set()
    for spec in (str(allowed / ".." / "secret"), str(allowed / "link"), str(allowed / "missing"),
                 str(allowed / ".." / "missing"), "/etc", "lerobot/x"):
        with pytest.raises(PolicySourceError) as e:
            resolve_policy(spec, (str(allowed),))
        answers.add((e.value.code, e.value.message.replace(shown(spec, 80), "SPEC")))
    assert len(answers) == 1 and answers.pop()[0] == "policy_not_allowed"  # one code, one text, whatever the path


def test_control_characters_are_escaped(tmp_path):
    with pytest.raises(PolicySourceError) as e:
        resolve_policy("/x/\x1b[31mred\n", (str(tmp_path),))
    assert "\x1b" not in e.value.message and "\n" not in e.value.message and "\\x1b" in e.value.message


def test_allow_hub_patterns():
    assert hub_patterns("lerobot/*, myorg/*") == ("lerobot/*", "myorg/*")
    with pytest.raises(ValueError, match="not ORG/NAME"):
        hub_patterns("lerobot")


def test_openpi_server_serves_a_hub_policy_offline(offline_cache):
    pytest.importorskip("lerobot")
    openpi = pytest.importorskip("openpi_client.websocket_client_policy")
    from lerobot_policies import make_policy_dir

    from robotserve_ros.transport.openpi.config import EndpointConfig, OpenPiConfig
    from robotserve_ros.transport.openpi.server import OpenPiServer

    snap = lay_out(offline_cache, "lerobot/tiny_smolvla")
    make_policy_dir("smolvla", snap, steps=2)  # save_pretrained: config.json, model.safetensors, processors
    srv = OpenPiServer(OpenPiConfig(policy="lerobot/tiny_smolvla", allow_hub=("lerobot/*",),
                                    endpoint=EndpointConfig(port=0)))
    try:
        c = openpi.WebsocketClientPolicy("127.0.0.1", srv.port)
        meta = c.get_server_metadata()
        assert meta["policy"] == {"type": "smolvla", "hub_id": "lerobot/tiny_smolvla", "revision": REV}
        shape = meta["images"]["observation/image"]["shape"]
        a = c.infer({"observation/image": np.zeros(shape, np.uint8),
                     "observation/state": np.zeros(meta["state"]["dim"], np.float32), "prompt": "go"})["actions"]
        assert a.shape == (meta["chunk_size"], meta["action_dim"])
    finally:
        srv.stop()


def test_lerobot_endpoint_takes_allowed_hub_ids(offline_cache):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("lerobot")
    import test_lerobot_compat as lc

    from robotserve_ros.transport.lerobot.config import CompatConfig
    from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer

    lay_out(offline_cache, "lerobot/dp", {"config.json": b"{}", "model.safetensors": _weights()})
    srv = LeRobotCompatServer(CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8},
                                           profile_ms={1: 5.0}, policy_dirs=("/policies",), allow_hub=("lerobot/*",)))
    try:
        c = lc.Client(srv.port)
        c.start(path="lerobot/dp")
        (group,) = srv.servicer.groups.values()
        assert group.key[1] == os.path.realpath(offline_cache / "models--lerobot--dp" / "snapshots" / REV)
        c2 = lc.Client(srv.port)
        c2.stub.Ready(lc.pb.Empty())
        lc._refused(lambda: c2.stub.SendPolicyInstructions(lc.policy_setup(path="other/dp")),
                    grpc.StatusCode.PERMISSION_DENIED)
        c.close()
        c2.close()
    finally:
        srv.stop(0)


def test_a_hub_id_is_pinned_once_per_process(offline_cache):
    snap = lay_out(offline_cache, "lerobot/pinned", {"model.safetensors": _weights()})
    first = resolve_policy("lerobot/pinned", allow_hub=("lerobot/*",))
    (snap.parent.parent / "refs" / "main").write_text("f" * 40)  # main moves on the hub meanwhile
    assert resolve_policy("lerobot/pinned", allow_hub=("lerobot/*",)) == first  # still the pinned revision


def test_hub_resolutions_are_budgeted_and_failures_remembered(offline_cache, monkeypatch):
    """Clients name hub ids: a name that failed is answered from memory for failure_ttl_s, at
    most per_window new names are resolved per window (then hub_busy at once), a name being
    resolved is resolved once for every caller waiting on it."""
    import threading
    import time

    now = [0.0]
    hub = policy_source.HubResolutions(per_window=3, window_s=60.0, failure_ttl_s=300.0, clock=lambda: now[0])
    monkeypatch.setattr(policy_source, "HUB", hub)
    allow = ("lerobot/*",)
    for _ in range(5):  # not in the (offline) cache: one hub call, then the remembered failure
        with pytest.raises(PolicySourceError) as e:
            resolve_policy("lerobot/missing", allow_hub=allow)
        assert e.value.code == "hub_unavailable"
    assert hub.hub_calls == 1
    lay_out(offline_cache, "lerobot/a", {"model.safetensors": _weights()})
    assert resolve_policy("lerobot/a", allow_hub=allow).hub_id == "lerobot/a"
    with pytest.raises(PolicySourceError):
        resolve_policy("lerobot/b", allow_hub=allow)
    with pytest.raises(PolicySourceError) as e:  # a fourth new name in the window
        resolve_policy("lerobot/c", allow_hub=allow)
    assert e.value.code == "hub_busy" and hub.hub_calls == 3
    assert resolve_policy("lerobot/a", allow_hub=allow).hub_id == "lerobot/a"  # pinned: no budget needed
    now[0] = 61.0  # the window moved on; the failure is still remembered
    with pytest.raises(PolicySourceError) as e:
        resolve_policy("lerobot/missing", allow_hub=allow)
    assert e.value.code == "hub_unavailable" and hub.hub_calls == 3
    now[0] = 400.0  # remembered no longer: asked again
    with pytest.raises(PolicySourceError):
        resolve_policy("lerobot/missing", allow_hub=allow)
    assert hub.hub_calls == 4

    # one resolution for many callers of the same name at once
    slow = policy_source.HubResolutions(clock=time.monotonic)
    calls = []

    def fetch():
        calls.append(1)
        time.sleep(0.2)
        return policy_source.PolicySource("/x", "lerobot/slow", "r")

    got = []
    threads = [threading.Thread(target=lambda: got.append(slow.resolve(("lerobot/slow", None, "c"), fetch)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(calls) == 1 and len(got) == 8 and len(set(got)) == 1
