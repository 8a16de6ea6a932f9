"""Running the ROS node suite as processes: `robotserve up`, the live fleet demo, live benchmarks."""
