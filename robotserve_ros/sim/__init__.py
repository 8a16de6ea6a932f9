"""Virtual-clock fleet simulator, workloads and metrics (the fleet benchmarks and their reports: bench/)."""
