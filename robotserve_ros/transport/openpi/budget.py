"""The openpi endpoint's budgets: connections at once and bytes of frames held (being read,
queued, or being answered), per peer and in total.

A peer is an API key holder when the server checks keys (a fleet behind one NAT, or every
robot of a bench on loopback, shares one address but not one attacker's fate), else its IP
address: unauthenticated peers are capped per address. Every peer stays within the totals.

Frame bytes are reserved from a frame's header, before its body is read: a connection whose
frame does not fit waits (its socket is not read meanwhile, so TCP holds the bytes in the
client), it is not read then refused. A frame larger than a cap it can never fit is refused.
Waiters are granted in arrival order; one whose own peer is full does not hold back another
peer's. Runs on the endpoint's event loop thread only (no lock)."""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Caps:
    connections: int
    pending_bytes: int


class TooLarge(Exception):
    """A frame larger than a cap it could ever fit in: (limit name, cap)."""

    def __init__(self, name: str, cap: int) -> None:
        super().__init__(name, cap)
        self.name, self.cap = name, cap


class _Ticket:
    __slots__ = ("peer", "n", "on_grant", "granted")

    def __init__(self, peer: tuple, n: int, on_grant: Callable[[], None]) -> None:
        self.peer, self.n, self.on_grant, self.granted = peer, n, on_grant, False


class Budgets:
    """`peer` is ("key", holder) or ("addr", ip); refusals name the parameter that refused."""

    def __init__(self, total: Caps, per_key: Caps, per_address: Caps) -> None:
        self.total, self.per_key, self.per_address = total, per_key, per_address
        self.connections: Counter = Counter()  # peer -> connections at once
        self.held: Counter = Counter()  # peer -> frame bytes reserved
        self.active = 0
        self.held_total = 0
        self.waiting: deque = deque()

    def caps(self, peer: tuple) -> tuple:
        """(its caps, the suffix its parameters are named with)."""
        return (self.per_key, "per_key") if peer[0] == "key" else (self.per_address, "per_peer")

    # --- connections -------------------------------------------------------------------------
    def admit(self, peer: tuple) -> Optional[str]:
        """Counts a connection in, or says which cap refuses it (its parameter's name)."""
        if self.active >= self.total.connections:
            return "max_connections"
        caps, suffix = self.caps(peer)
        if self.connections[peer] >= caps.connections:
            return f"max_connections_{suffix}"
        self.active += 1
        self.connections[peer] += 1
        return None

    def leave(self, peer: tuple) -> None:
        self.active -= 1
        self.connections[peer] -= 1
        if not self.connections[peer]:
            del self.connections[peer]

    # --- frame bytes -------------------------------------------------------------------------
    def reserve(self, peer: tuple, n: int, on_grant: Callable[[], None]) -> _Ticket:
        """A ticket for n bytes: granted now if they fit and nobody waits before it, else
        queued (on_grant is called when it is granted). TooLarge if n can never fit."""
        caps, suffix = self.caps(peer)
        for cap, name in ((caps.pending_bytes, f"max_pending_bytes_{suffix}"), (self.total.pending_bytes, "max_pending_bytes")):
            if n > cap:
                raise TooLarge(name, cap)
        t = _Ticket(peer, n, on_grant)
        # a waiter held back by the total is not overtaken; one held back by its own peer's cap is
        if self._fits(t) and not any(self.held_total + w.n > self.total.pending_bytes for w in self.waiting):
            self._take(t)
        else:
            self.waiting.append(t)
        return t

    def cancel(self, t: _Ticket) -> None:
        """A waiting ticket whose connection went away (a granted one is released instead)."""
        if not t.granted:
            try:
                self.waiting.remove(t)
            except ValueError:
                pass
            self._grant()

    def release(self, peer: tuple, n: int) -> None:
        if n <= 0:
            return
        self.held_total -= n
        self.held[peer] -= n
        if self.held[peer] <= 0:
            del self.held[peer]
        self._grant()

    def _fits(self, t: _Ticket) -> bool:
        return (self.held_total + t.n <= self.total.pending_bytes
                and self.held[t.peer] + t.n <= self.caps(t.peer)[0].pending_bytes)

    def _take(self, t: _Ticket) -> None:
        t.granted = True
        self.held_total += t.n
        self.held[t.peer] += t.n

    def _grant(self) -> None:
        """In arrival order; a ticket its own peer's cap holds back is skipped, one the total
        holds back stops the pass (nobody overtakes it on the total)."""
        for t in list(self.waiting):
            if self.held_total + t.n > self.total.pending_bytes:
                return
            if self._fits(t):
                self.waiting.remove(t)
                self._take(t)
                t.on_grant()
