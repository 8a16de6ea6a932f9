"""The openpi endpoint: openpi's own unchanged WebsocketClientPolicy end to end (answers, its
error path), every limit refused with one line while a good client keeps being served, the
API key, /healthz, the key map; on the profile-driven stand-in engine (no model) and once
on the tiny SmolVLA the LeRobot tests use."""
from __future__ import annotations

import http.client
import threading

import msgpack
import numpy as np
import pytest

pytest.importorskip("websockets")
openpi_client = pytest.importorskip("openpi_client.websocket_client_policy")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from robotserve_ros.transport.openpi.config import EndpointConfig, OpenPiConfig  # noqa: E402
from robotserve_ros.transport.openpi.server import OpenPiServer  # noqa: E402

Client = openpi_client.WebsocketClientPolicy
STATE = np.arange(6, dtype=np.float32)


def obs(**extra) -> dict:
    return {"observation/state": STATE, "prompt": "pick up the cube", **extra}


def sim_server(**endpoint) -> OpenPiServer:
    ep = EndpointConfig(port=0, **endpoint)
    return OpenPiServer(OpenPiConfig(engine="simulated", engine_params={"chunk_size": 8, "action_dim": 6},
                                     profile_ms={1: 5.0, 4: 8.0}, endpoint=ep))


@pytest.fixture
def server():
    srv = sim_server(max_message_bytes=1 << 16, max_array_elements=1000, max_nesting_depth=6, max_string_bytes=100,
                     max_connections=4, max_rate_hz=50.0, rate_burst=5)
    yield srv
    srv.stop()


def test_unchanged_client_round_trips(server):
    c = Client("127.0.0.1", server.port)
    meta = c.get_server_metadata()
    assert meta["protocol"] == "openpi" and meta["chunk_size"] == 8 and meta["action_dim"] == 6
    assert meta["state"]["key"] == "observation/state" and meta["prompt"] == "prompt"
    chunks = [c.infer(obs())["actions"] for _ in range(4)]
    assert all(a.shape == (8, 6) and a.dtype == np.float32 for a in chunks)
    assert not np.array_equal(chunks[0], chunks[1])  # each round is a new chunk of the task
    s = server.stats()
    assert s["endpoint"]["chunks"] == 4 and s["core"]["served"] == 4


def test_bad_observation_raises_the_clients_runtime_error_with_one_line(server):
    c = Client("127.0.0.1", server.port)
    with pytest.raises(RuntimeError) as e:
        c.infer({"prompt": "x"})
    text = str(e.value).split("\n", 1)[1]
    assert "observation/state" in text and "\n" not in text
    c2 = Client("127.0.0.1", server.port)
    with pytest.raises(RuntimeError, match="'camera' is not one this server takes"):
        c2.infer(obs(camera=np.zeros(3, np.uint8)))
    assert server.stats()["core"]["errors"].get("bad_observation") == 2  # counted by the core


def _ndarray(dtype: str, shape, data: bytes) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": list(shape)}


def _frame(**over) -> bytes:
    o = {"observation/state": _ndarray("<f4", (6,), STATE.tobytes()), "prompt": "go"}
    o.update(over)
    return msgpack.packb(o)


def _nested(depth: int):
    x = 1
    for _ in range(depth):
        x = [x]
    return x


# Each limit: the frame that breaks it and what its one line must name.
LIMITS = {
    "object_dtype": (_frame(**{"observation/state": _ndarray("|O", (1,), b"\0" * 8)}), "no object dtypes"),
    "unicode_dtype": (_frame(**{"observation/state": _ndarray("<U4", (1,), b"\0" * 16)}), "not accepted"),
    "too_many_elements": (_frame(**{"observation/state": _ndarray("|u1", (2000,), b"\0" * 2000)}), "max_array_elements"),
    "too_deep": (_frame(deep=_nested(10)), "max_nesting_depth"),
    "too_long_string": (_frame(prompt="x" * 200), "max_string_bytes"),
    "bad_shape": (_frame(**{"observation/state": _ndarray("<f4", (7,), STATE.tobytes())}), "shape x itemsize"),
    "ext_type": (_frame(x=msgpack.ExtType(5, b"abc")), "no ext types"),
    "not_a_map": (msgpack.packb([1, 2]), "must be a msgpack map"),
    "text_frame": ("hello", "binary msgpack"),
}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_limit_is_one_line_and_a_good_client_keeps_being_served(server, name):
    frame, words = LIMITS[name]
    good = Client("127.0.0.1", server.port)
    good.infer(obs())
    with connect(f"ws://127.0.0.1:{server.port}", compression=None) as ws:
        ws.recv()  # metadata
        ws.send(frame)
        reply = ws.recv()
        assert isinstance(reply, str) and words in reply and "\n" not in reply
        with pytest.raises(ConnectionClosed):
            ws.recv()  # and the connection closes
    assert good.infer(obs())["actions"].shape == (8, 6)


def test_oversized_message_is_refused_before_it_is_read(server):
    good = Client("127.0.0.1", server.port)
    with connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None) as ws:
        ws.recv()
        ws.send(_frame(pad=b"\0" * (1 << 17)))
        with pytest.raises(ConnectionClosed) as e:
            ws.recv()
    assert e.value.rcvd.code == 1009  # websockets' "message too big", from the frame header
    assert good.infer(obs())["actions"].shape == (8, 6)


def test_rate_limit(server):
    with connect(f"ws://127.0.0.1:{server.port}", compression=None) as ws:
        ws.recv()
        for _ in range(30):  # far past the burst of 5 and 50 calls/s, sent without waiting
            ws.send(_frame())
        replies = []
        while not replies or isinstance(replies[-1], bytes):
            replies.append(ws.recv())
    assert "max_rate_hz" in replies[-1] and 5 <= len(replies) - 1 < 30
    assert server.endpoint.refused["rate_limited"] == 1


def test_connections_at_once(server):
    held = [Client("127.0.0.1", server.port) for _ in range(4)]
    with pytest.raises(InvalidStatus) as e:
        Client("127.0.0.1", server.port)
    assert e.value.response.status_code == 503 and b"max_connections" in e.value.response.body
    assert held[0].infer(obs())["actions"].shape == (8, 6)
    held[1]._ws.close()  # one leaves: a slot frees
    for _ in range(50):
        if server.endpoint.budgets.active < 4:
            break
        threading.Event().wait(0.02)
    assert Client("127.0.0.1", server.port).infer(obs())["actions"].shape == (8, 6)


def test_api_key_and_healthz(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    srv = sim_server(api_key_file=str(key))
    try:
        for wrong in (None, "nope", "s3cret2"):
            with pytest.raises(InvalidStatus) as e:
                Client("127.0.0.1", srv.port, api_key=wrong)
            assert e.value.response.status_code == 401
        assert Client("127.0.0.1", srv.port, api_key="s3cret").infer(obs())["actions"].shape == (8, 6)
        h = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        h.request("GET", "/healthz")
        assert h.getresponse().status == 200
        assert srv.endpoint.refused["bad_api_key"] == 3
    finally:
        srv.stop()


def _upgrade(port: int, *headers) -> int:
    """A websocket upgrade request with extra headers; the HTTP status it gets."""
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    h.putrequest("GET", "/")
    for k, v in (("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
                 ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), *headers):
        h.putheader(k, v)
    h.endheaders()
    return h.getresponse().status


def test_two_authorization_headers_are_refused_not_an_error(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    srv = sim_server(api_key_file=str(key))
    try:
        assert _upgrade(srv.port, ("Authorization", "Api-Key s3cret"), ("Authorization", "Api-Key s3cret")) == 401
        assert _upgrade(srv.port, ("Authorization", "Api-Key s3cret")) == 101
        assert srv.endpoint.refused["bad_api_key"] == 1
    finally:
        srv.stop()


def test_a_bare_tcp_connect_is_one_counted_log_line(server, caplog):
    import logging
    import socket
    import time

    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        socket.create_connection(("127.0.0.1", server.port)).close()
    deadline = time.monotonic() + 5
    while server.endpoint.refused["bad_handshake"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.endpoint.refused["bad_handshake"] == 3
    failed = [r for r in caplog.records if "handshake failed" in r.getMessage()]
    assert len(failed) == 3 and all(r.exc_info is None and r.levelno == logging.INFO for r in failed)
    assert "Traceback" not in caplog.text
    assert Client("127.0.0.1", server.port).infer(obs())["actions"].shape == (8, 6)  # and it serves on


@pytest.mark.parametrize("content", ["", "  \n"])
def test_empty_or_unreadable_key_file_stops_the_start(tmp_path, content):
    from robotserve_ros.cli import main

    f = tmp_path / "key"
    f.write_text(content)
    assert main(["openpi-server", "--policy", str(tmp_path), "--api-key-file", str(f)]) == 2
    assert main(["openpi-server", "--policy", str(tmp_path), "--api-key-file", str(tmp_path / "none")]) == 2


def test_listens_on_loopback_by_default(server):
    assert server.endpoint.bound and all(ip == "127.0.0.1" for ip, _ in server.endpoint.bound)


def test_exec_dict_and_reset(server):
    c = Client("127.0.0.1", server.port)
    c.infer(obs())
    r = c.infer(obs(**{"robotserve/exec": {"actions_left": 3, "control_hz": 20.0, "horizon": 5}}))
    assert r["actions"].shape == (5, 6)
    first = r["robotserve"]["task"]
    r = c.infer(obs(**{"robotserve/exec": {"reset": True}}))
    assert r["robotserve"]["task"] != first and r["robotserve"]["round"] == 0
    with pytest.raises(RuntimeError, match="robotserve/exec.control_hz"):
        c.infer(obs(**{"robotserve/exec": {"control_hz": -1.0}}))


def test_key_map_is_checked_against_the_policy():
    with pytest.raises(ValueError, match="come from no openpi key"):
        sim_server(key_map={"prompt": "task"})


@pytest.fixture(scope="module")
def smolvla_dir(tmp_path_factory):
    pytest.importorskip("lerobot")
    from lerobot_policies import make_policy_dir

    return make_policy_dir("smolvla", tmp_path_factory.mktemp("openpi") / "vla", steps=2)


def test_unchanged_client_on_tiny_smolvla(smolvla_dir):
    cfg = OpenPiConfig(policy=str(smolvla_dir), policy_dirs=(str(smolvla_dir.parent),), endpoint=EndpointConfig(port=0))
    srv = OpenPiServer(cfg)
    try:
        c = Client("127.0.0.1", srv.port)
        meta = c.get_server_metadata()
        assert list(meta["images"]) == ["observation/image"] and meta["policy"]["type"] == "smolvla"
        img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)  # resized to the policy's
        a = c.infer(obs(**{"observation/image": img}))["actions"]
        assert a.shape == (meta["chunk_size"], meta["action_dim"]) and np.all(np.isfinite(a))
        with pytest.raises(RuntimeError, match="observation/image"):
            c.infer(obs())
    finally:
        srv.stop()


def test_bench_fed_rule_and_rows():
    from robotserve_ros.bench.openpi import size_row

    fed = [{"idle_s": 0.5, "task_s": 10.0, "rounds_ms": [20.0, 30.0]}, {"idle_s": 1.2, "task_s": 10.0, "rounds_ms": [40.0]}]
    row, more = size_row(2, fed, 1.5)
    assert set(row) == {"robots", "idle_fraction", "p50_ms", "p95_ms", "mean_batch"}
    assert more["fed"] and row["idle_fraction"] == 0.085 and row["p50_ms"] == 30.0
    one_starved = fed + [{"idle_s": 3.0, "task_s": 10.0, "rounds_ms": [90.0]}]  # mean 0.157, one at 0.3
    assert not size_row(3, one_starved, 2.0)[1]["fed"]
    assert not size_row(3, fed, 1.0)[1]["fed"]  # a robot whose figures never came back is not fed


def test_one_address_cannot_take_every_slot():
    """Per-peer cap: idle connections from one address (127.0.0.2) stop at
    max_connections_per_peer with a 503 naming it; a robot at another address is served
    meanwhile, and the address gets its slot back when one of its connections closes."""
    import socket

    srv = sim_server(max_connections=8, max_connections_per_peer=2)
    try:
        def from_other_address():
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5, source_address=("127.0.0.2", 0))
            return connect(f"ws://127.0.0.1:{srv.port}", sock=sock, compression=None)

        held = [from_other_address() for _ in range(2)]
        with pytest.raises(InvalidStatus) as e:
            from_other_address()
        assert e.value.response.status_code == 503 and b"max_connections_per_peer" in e.value.response.body
        assert b"from this address (no API key)" in e.value.response.body
        good = Client("127.0.0.1", srv.port)
        assert good.infer(obs())["actions"].shape == (8, 6)
        assert srv.endpoint.refused["too_many_connections_per_peer"] == 1
        assert srv.endpoint.stats()["peers"] == 2
        held[0].close()
        for _ in range(100):
            if srv.endpoint.budgets.connections[("addr", "127.0.0.2")] < 2:
                break
            threading.Event().wait(0.02)
        held.append(from_other_address())  # its slot came back
        assert good.infer(obs())["actions"].shape == (8, 6)
    finally:
        srv.stop()


def _from(port: int, address: str = "127.0.0.2"):
    """A raw websocket from another loopback address, its metadata read."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(address, 0))
    ws = connect(f"ws://127.0.0.1:{port}", sock=sock, compression=None)
    ws.recv()
    return ws


def _until(cond, seconds: float = 5.0) -> bool:
    for _ in range(int(seconds / 0.01)):
        if cond():
            return True
        threading.Event().wait(0.01)
    return cond()


def test_one_address_waits_for_its_pending_share_while_others_are_served():
    """max_pending_bytes_per_peer: while one address's frame waits for a slow engine, its next
    frame past its share is not read (its connection waits for budget, TCP holding the
    bytes); a robot at another address is served meanwhile; then the waiting frame is read
    and answered, nothing refused."""
    srv = sim_server(max_pending_bytes_per_peer=100_000, max_string_bytes=60_000, rate_burst=10)
    srv.engine.infer = slow(srv.engine.infer, 1.0)
    try:
        other = [_from(srv.port), _from(srv.port)]
        other[0].send(_frame(prompt="p" * 55_000))  # held while the engine is slow
        assert _until(lambda: srv.endpoint.budgets.held_total)
        other[1].send(_frame(prompt="q" * 55_000))
        assert _until(lambda: srv.endpoint.stats()["waiting_for_budget"] == 1)
        assert srv.endpoint.budgets.held[("addr", "127.0.0.2")] < 100_000  # the second frame's body is not held
        assert Client("127.0.0.1", srv.port).infer(obs(prompt="g" * 55_000))["actions"].shape == (8, 6)
        assert isinstance(other[0].recv(), bytes) and isinstance(other[1].recv(), bytes)  # both answered
        assert not srv.endpoint.refused and srv.endpoint.stats()["waiting_for_budget"] == 0
        assert _until(lambda: srv.endpoint.budgets.held_total == 0)
    finally:
        srv.stop()


def slow(infer, seconds: float):
    def run(batch):
        threading.Event().wait(seconds)
        return infer(batch)
    return run


def test_a_frame_that_can_never_fit_the_pending_budget_is_refused_unread():
    """max_pending_bytes (all connections together): a frame larger than it is refused from
    its header with one line naming it (then closed 1009), its body never read, counted; a
    robot within it is served."""
    srv = sim_server(max_pending_bytes=4096)
    try:
        with connect(f"ws://127.0.0.1:{srv.port}", compression=None) as ws:
            ws.recv()
            ws.send(_frame(pad=b"x" * 8192))
            said = ws.recv()
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv()
        assert isinstance(said, str) and "can never fit max_pending_bytes (4096)" in said
        assert closed.value.rcvd.code == 1009
        assert srv.endpoint.refused["frame_over_budget"] == 1 and srv.endpoint.budgets.held_total == 0
        assert Client("127.0.0.1", srv.port).infer(obs())["actions"].shape == (8, 6)
        assert _until(lambda: srv.endpoint.budgets.held_total == 0)
    finally:
        srv.stop()


def test_frames_past_the_total_budget_wait_and_are_served_in_turn():
    """Two addresses, a total budget one frame fits: the second frame waits unread until the
    first is answered, then is served; nothing refused, nothing left held."""
    srv = sim_server(max_pending_bytes=70_000, max_string_bytes=60_000)
    srv.engine.infer = slow(srv.engine.infer, 0.5)
    try:
        a, b = _from(srv.port, "127.0.0.2"), _from(srv.port, "127.0.0.3")
        a.send(_frame(prompt="a" * 55_000))
        assert _until(lambda: srv.endpoint.budgets.held_total)
        b.send(_frame(prompt="b" * 55_000))
        assert _until(lambda: srv.endpoint.stats()["waiting_for_budget"] == 1)
        assert srv.endpoint.budgets.held_total <= 70_000
        assert isinstance(a.recv(), bytes) and isinstance(b.recv(timeout=10), bytes)
        assert not srv.endpoint.refused
        assert _until(lambda: srv.endpoint.budgets.held_total == 0)
    finally:
        srv.stop()


def test_failed_handshakes_give_their_slot_back(server):
    for _ in range(6):  # more than max_connections plain HTTP requests that never upgrade
        h = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        h.request("GET", "/")
        assert h.getresponse().status >= 400
        h.close()
    assert server.endpoint.budgets.active == 0
    assert Client("127.0.0.1", server.port).infer(obs())["actions"].shape == (8, 6)


def test_a_round_the_engine_fails_on_ends_its_own_call_and_others_are_served():
    """One request the engine raises on (past every check): its client gets the error at once
    (not a reply timeout), and a client batched beside it is served."""
    srv = sim_server(reply_timeout_s=30.0)
    real = srv.engine.infer
    seen = []

    def infer(batch):
        seen.append(len(batch))
        if any(float(r.observation.joints[0]) == 666.0 for r in batch):
            raise IndexError("index 17 is out of bounds")
        return real(batch)

    srv.engine.infer = infer
    try:
        good = Client("127.0.0.1", srv.port)
        out: list = []
        t = threading.Thread(target=lambda: out.extend(good.infer(obs())["actions"].shape for _ in range(6)))
        t.start()
        bad = Client("127.0.0.1", srv.port)
        with pytest.raises(RuntimeError, match=r"round 0 failed \d+ batches .IndexError.; send it again"):
            bad.infer({"observation/state": np.full(6, 666.0, np.float32), "prompt": "x"})
        t.join(30)
        assert out == [(8, 6)] * 6
        assert Client("127.0.0.1", srv.port).infer(obs())["actions"].shape == (8, 6)  # and after
    finally:
        srv.stop()


def test_authenticated_robots_are_budgeted_per_key_not_per_address(tmp_path):
    """Many robots behind one address that present a key are all served under the defaults
    (past max_connections_per_peer, which binds unauthenticated peers only); each key holder
    has its own max_connections_per_key, refused with a 503 naming it and counted, while
    another holder keeps connecting and being served."""
    key = tmp_path / "keys"
    key.write_text("fleet-a\nfleet-b\n")
    srv = sim_server(api_key_file=str(key))  # the defaults otherwise
    try:
        many = [Client("127.0.0.1", srv.port, api_key="fleet-a") for _ in range(srv.cfg.endpoint.max_connections_per_peer + 8)]
        assert all(c.infer(obs())["actions"].shape == (8, 6) for c in many)
        assert srv.endpoint.budgets.connections[("key", 0)] == len(many) and not srv.endpoint.refused
    finally:
        srv.stop()
    srv = sim_server(api_key_file=str(key), max_connections_per_key=3)
    try:
        held = [Client("127.0.0.1", srv.port, api_key="fleet-a") for _ in range(3)]
        with pytest.raises(InvalidStatus) as e:
            Client("127.0.0.1", srv.port, api_key="fleet-a")
        assert e.value.response.status_code == 503 and b"with this API key" in e.value.response.body
        assert b"max_connections_per_key" in e.value.response.body
        assert srv.endpoint.refused["too_many_connections_per_key"] == 1
        assert Client("127.0.0.1", srv.port, api_key="fleet-b").infer(obs())["actions"].shape == (8, 6)
        assert held[0].infer(obs())["actions"].shape == (8, 6)
    finally:
        srv.stop()
