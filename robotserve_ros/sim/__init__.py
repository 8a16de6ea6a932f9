"""Virtual-clock fleet simulator, workloads, metrics and benchmark reports."""
