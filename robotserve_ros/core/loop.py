"""The live driver of every serving core: one dispatcher thread, one thread per worker slot.

A serving core (core/contract.py) hands out work items for named slots (a tier's engine
slots for action chunks; a prefill worker, a decode worker, a vision stage for the language
cores) and is told when each item ended. `LiveDriver` is the part that is the same for all
of them; `LiveDriver.for_core(core, run)` drives any core through the contract:

- `dispatch()` is called whenever work arrived (by the dispatcher thread) or a slot freed (by
  that slot's thread, at once), and returns work items, each naming its slot (`item.slot`)
  and taken by one idle thread of that slot; it must be safe to call from several threads
  (it takes the core's lock);
- `run(slot, item)` is the slot thread's work: the engine call and whatever completes it.
  An exception escaping it is logged and handed to `on_crash(slot, item, exc)`: the slot
  lives on, so one bad item never stops the server;
- `kick()` says "look again"; `close()` stops every thread.

The driver holds no lock of its own over the core: `dispatch` and `run` take the core's.
The simulator does not use it: sim/loop.py, the one virtual-clock loop, calls the same steps.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Hashable, Iterable, Mapping, Optional

log = logging.getLogger("robotserve.loop")


class LiveDriver:
    def __init__(
        self,
        slots: Mapping[Hashable, int],
        dispatch: Callable[[], Iterable[tuple]],
        run: Callable[[Hashable, object], None],
        *,
        on_crash: Optional[Callable[[Hashable, object, Exception], None]] = None,
        poll_s: float = 0.05,
        name: str = "dispatcher",
    ) -> None:
        if not slots or any(n < 1 for n in slots.values()):
            raise ValueError(f"every slot needs >= 1 thread, got {dict(slots)}")
        self.slots, self._dispatch, self._run = dict(slots), dispatch, run
        self.on_crash, self.poll_s, self.name = on_crash, poll_s, name
        self._work = threading.Event()
        self._stop = threading.Event()
        self._queues: dict = {}
        self._threads: list[threading.Thread] = []

    @classmethod
    def for_core(cls, core, run: Callable[[Hashable, object], None], **kw) -> "LiveDriver":
        """Drive a serving core through the contract: its slots, its dispatch, `run` per item."""
        return cls(core.slots, core.dispatch, run, **kw)

    @property
    def running(self) -> bool:
        return bool(self._threads) and not self._stop.is_set()

    def start(self) -> "LiveDriver":
        if self._threads:
            return self
        self._queues = {s: queue.SimpleQueue() for s in self.slots}
        self._threads = [threading.Thread(target=self._dispatch_loop, name=self.name, daemon=True)]
        for s, n in self.slots.items():
            for k in range(n):
                self._threads.append(threading.Thread(target=self._slot_loop, args=(s,), name=f"{s}-{k}", daemon=True))
        for th in self._threads:
            th.start()
        return self

    def kick(self) -> None:
        """Work arrived or a slot freed: dispatch again."""
        self._work.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` (a slot's retry pause); True if the driver is stopping."""
        return self._stop.wait(seconds)

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            self._work.wait(self.poll_s)
            self._work.clear()
            if self._stop.is_set():
                break
            try:
                items = list(self._dispatch())
            except Exception:  # a core fault is logged; the loop keeps dispatching
                log.exception("%s: dispatch failed", self.name)
                continue
            self._hand_out(items)

    def _hand_out(self, items) -> None:
        for item in items:
            self._queues[item.slot].put(item)

    def _dispatch_here(self) -> None:
        """A slot that just freed dispatches at once on its own thread: the next batch starts
        without waiting for the dispatcher thread to be scheduled (on a loaded machine that
        wake-up, not the dispatch itself, is what leaves the engine idle between batches)."""
        try:
            self._hand_out(self._dispatch())
        except Exception:
            log.exception("%s: dispatch failed", self.name)

    def _slot_loop(self, slot: Hashable) -> None:
        q = self._queues[slot]
        while True:
            item = q.get()
            if item is None:
                return
            try:
                self._run(slot, item)
            except Exception as e:  # the slot must outlive any one item
                log.exception("%s: serving an item on %s failed", self.name, slot)
                if self.on_crash is not None:
                    try:
                        self.on_crash(slot, item, e)
                    except Exception:
                        log.exception("%s: on_crash failed", self.name)
            if self._stop.is_set():
                continue
            self._dispatch_here()
            self.kick()

    def close(self, join_s: float = 2.0) -> None:
        self._stop.set()
        self._work.set()
        for q in self._queues.values():
            for _ in range(len(self._threads)):
                q.put(None)
        for th in self._threads:
            th.join(timeout=join_s)
