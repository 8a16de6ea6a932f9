"""robotserve_ros: execution-aware serving of physical-AI models to robot fleets."""
# Lets a source checkout on sys.path still find interfaces generated into an installed
# prefix (msg/srv), once the ROS build adds them.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
