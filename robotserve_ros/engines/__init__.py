"""Model runners behind core.Engine: simulated (here), torch/LeRobot and remote (later)."""
from .simulated import SimulatedEngine

__all__ = ["SimulatedEngine"]
