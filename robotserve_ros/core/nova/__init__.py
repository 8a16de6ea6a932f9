"""Nova (seed 003): stage-pipelined VLM serving with an adaptive partition of the device.

partition.py: profiles, the partition interface, Nova's Pareto/Eq. 5 plan; serving.py: the
VLM serving core and its schedulers; live.py: the live path on core/loop.py's LiveDriver.
The virtual-clock replay is sim/nova.py."""
from .partition import (PartitionMechanism, PartitionPlan, PartitionUnavailable, StageProfile, paper_profile,
                        pareto_frontier)
from .serving import VLM_SCHEDULERS, Op, VLMCore, VLMRequest, make_vlm_scheduler, op_time

__all__ = ["PartitionMechanism", "PartitionPlan", "PartitionUnavailable", "StageProfile", "paper_profile",
           "pareto_frontier", "VLM_SCHEDULERS", "Op", "VLMCore", "VLMRequest", "make_vlm_scheduler", "op_time"]
