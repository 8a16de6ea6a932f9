"""The leftover rebuilt on the server for LeRobot and openpi clients (core/rtc_rebuild.py):
from the session's last served chunk and the client's timing, no ROS, no network."""
from __future__ import annotations

import numpy as np

from robotserve_ros.core.rtc_rebuild import ServedChunk, executed_since, rebuild_leftover

ROWS = np.arange(20, dtype=np.float32).reshape(10, 2)


def test_by_timestep_lerobot_the_rows_from_the_observations_timestep_on():
    served = ServedChunk(ROWS, first_timestep=100, sent_at=5.0)
    left = rebuild_leftover(served, now=99.0, control_hz=30.0, timestep=104)  # the timestep wins over time
    np.testing.assert_array_equal(left, ROWS[4:])
    assert left.dtype == np.float32


def test_by_time_openpi_the_rows_the_control_rate_has_not_reached():
    served = ServedChunk(ROWS, first_timestep=None, sent_at=2.0)
    assert executed_since(served, 2.3, 10.0) == 3  # 0.3 s x 10 Hz, no float floor(2.999) surprise
    np.testing.assert_array_equal(rebuild_leftover(served, 2.3, 10.0), ROWS[3:])
    # a timestep without a timed log falls back to the time
    np.testing.assert_array_equal(rebuild_leftover(served, 2.3, 10.0, timestep=7), ROWS[3:])


def test_nothing_served_or_all_of_it_run_means_no_leftover():
    assert rebuild_leftover(None, 1.0, 10.0) is None
    served = ServedChunk(ROWS, first_timestep=0, sent_at=0.0)
    assert rebuild_leftover(served, 0.0, 10.0, timestep=10) is None
    assert rebuild_leftover(served, 0.0, 10.0, timestep=50) is None
    assert rebuild_leftover(ServedChunk(ROWS, None, 0.0), 5.0, 10.0) is None


def test_a_clock_or_timestep_behind_the_log_gives_the_whole_chunk():
    np.testing.assert_array_equal(rebuild_leftover(ServedChunk(ROWS, 100, 5.0), 0.0, 10.0, timestep=90), ROWS)
    np.testing.assert_array_equal(rebuild_leftover(ServedChunk(ROWS, None, 5.0), 4.0, 10.0), ROWS)
