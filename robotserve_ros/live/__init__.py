"""Running the ROS node suite as processes: `robotserve up`, the live fleet demo; the live benchmarks that start them are in bench/."""
