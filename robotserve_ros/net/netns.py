"""Two hosts on this machine: network namespaces `<name>-a` and `<name>-b` joined by a veth
pair, each end shaped by tbf to `rate_mbit` (the link's bandwidth, both directions).

    with NetnsLink(rate_mbit=1000) as link:
        srv = link.popen("b", [sys.executable, "-m", ...])   # a process on host b
        ...  link.addr_b is b's address as a seen from a

Names are unique per run (pid + counter), so parallel runs and a crashed earlier run do
not collide; the namespaces (and with them the veth pair and its qdiscs) are deleted on
exit, also when the body raised, and processes started in them are killed first.
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from typing import Optional, Sequence

_count = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def netns_available() -> Optional[str]:
    """None when namespaces can be made here; else why not (for a clean skip)."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed: apt-get install iproute2"
    probe = f"rsprobe{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class NetnsLink:
    def __init__(self, rate_mbit: float = 1000.0, burst_kb: int = 256, name: Optional[str] = None) -> None:
        n = next(_count)
        self.name = name or f"rs{os.getpid() % 100000}x{n}"
        self.ns_a, self.ns_b = f"{self.name}-a", f"{self.name}-b"
        self.if_a, self.if_b = f"{self.name}a"[:15], f"{self.name}b"[:15]
        # A private /30-ish subnet per run: 10.<pid-derived>.<n>.0/24.
        net = f"10.{200 + os.getpid() % 50}.{n % 250}"
        self.addr_a, self.addr_b = f"{net}.1", f"{net}.2"
        self.rate_mbit, self.burst_kb = rate_mbit, burst_kb
        self._procs: list = []

    def __enter__(self) -> "NetnsLink":
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def _up(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.if_a, "type", "veth", "peer", "name", self.if_b)
        for ns, ifc, addr in ((self.ns_a, self.if_a, self.addr_a), (self.ns_b, self.if_b, self.addr_b)):
            _ip("link", "set", ifc, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifc)
            _ip("-n", ns, "link", "set", ifc, "up")
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifc, "root", "tbf",
                 "rate", f"{self.rate_mbit}mbit", "burst", f"{self.burst_kb}kb", "latency", "200ms"],
                check=True, capture_output=True, text=True,
            )

    def ns(self, side: str) -> str:
        return {"a": self.ns_a, "b": self.ns_b}[side]

    def command(self, side: str, argv: Sequence[str]) -> list:
        return ["ip", "netns", "exec", self.ns(side), *argv]

    def popen(self, side: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start a process inside host `side`; it is killed when the link closes."""
        p = subprocess.Popen(self.command(side, argv), **kw)
        self._procs.append(p)
        return p

    def run(self, side: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(side, argv), **kw)

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(5.0)
                except subprocess.TimeoutExpired:
                    pass
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "del", ns, check=False)  # takes the veth end and its qdisc with it

    def __exit__(self, *exc) -> None:
        self.close()
