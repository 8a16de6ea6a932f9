"""robot_client's side of real-time chunking served remotely (issue 28 item 2; RTC, arXiv
2506.07339 §4): the unexecuted leftover goes with each request, and a reply's chunk is placed
from action d on, the d actions of the leftover executed while waiting standing for its first
d rows. A reply the server generated unguided (d = -1) is blended as before. robot_client
calls these two functions and keeps the account of the delays it was served with."""
from __future__ import annotations

import numpy as np

from ..core.rtc_account import RtcAccount, merge_rtc  # noqa: F401 (robot_client's, here since issue 28)


def fill_leftover(request, queued: list) -> None:
    """srv/Infer's rtc_leftover: the queued actions, next first, row-major; empty: none left."""
    if queued:
        request.rtc_leftover = np.ascontiguousarray(queued, dtype=np.float32).ravel().tolist()
    request.rtc_leftover_actions = len(queued)
