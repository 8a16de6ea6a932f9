"""Tiny random-weight LeRobot policy directories for tests (built in the test, no hub).

    from lerobot_policies import make_policy_dir
    d = make_policy_dir("diffusion", tmp_path / "dp", n_obs_steps=2)   # also "act", "smolvla"

The builders live in robotserve_ros/engines/tiny_policies.py so `robotserve profile` runs can
make the same directories; this module is the tests' import point.
"""
from robotserve_ros.engines.tiny_policies import ACTION_DIM, STATE_DIM, make_policy_dir, make_tiny_vlm_dir  # noqa: F401
