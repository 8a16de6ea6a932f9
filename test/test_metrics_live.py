"""The inference server's Prometheus endpoint during a small live light fleet (real
processes on a ROS domain of their own): scraped in the run, its figures the Runner's own."""
from __future__ import annotations

from rosutil import requires_rclpy
from test_bench_live import _apply_env

pytestmark = requires_rclpy


def test_fleet_live_metrics_check_scrapes_the_runners_figures(tmp_path, monkeypatch):
    from robotserve_ros.bench.fleet_live import run_fleet_live

    _apply_env(monkeypatch)
    res = run_fleet_live(tmp_path / "m.json", robots=4, duration=6.0, per_process=2, log_dir=tmp_path / "logs",
                         verbose=False, light=True, metrics_check=True)
    mc = res["metrics_check"]
    assert mc["ok"], mc["failures"]
    assert mc["port"] > 0 and mc["scrapes_during_run"] >= 2, mc
    assert mc["served_by_scrape"] == sorted(mc["served_by_scrape"]) and mc["served_by_scrape"][-1] > 0, mc
    # The end-of-run scrape is what the server reported, and what the robots received.
    assert mc["scraped"] == mc["runner"] and mc["scraped"]["served"] == res["server"]["served"] > 0, mc
    assert res["lost_chunks"] == 0 and res["chunks_served"] > 0, res


def test_a_taken_metrics_port_is_one_line_and_exit_2():
    import socket

    from rosutil import start_node

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "-p", f"metrics.port:={port}"])
        try:
            code = proc.wait(timeout=60)
        finally:
            proc.stop()
    errors = [ln for ln in proc.stderr().splitlines() if ln.startswith("robotserve_ros:")]
    assert code == 2 and "Traceback" not in proc.output(), proc.output()
    assert len(errors) == 1 and errors[0].startswith(f"robotserve_ros: parameter 'metrics.port': cannot listen on "
                                                     f"127.0.0.1:{port}"), proc.output()
