"""Real network conditions on one machine: two network namespaces joined by a veth pair,
tbf shaping its bandwidth, and a delaying TCP relay adding the WAN's base latency (this
kernel has no netem). Needs root and iproute2 (`ip`, `tc`)."""
from .netns import NetnsLink, netns_available
from .relay import DelayRelay

__all__ = ["DelayRelay", "NetnsLink", "netns_available"]
