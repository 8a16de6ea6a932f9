"""rclpy nodes: thin translators between ROS messages and the core (docs/architecture.md)."""
