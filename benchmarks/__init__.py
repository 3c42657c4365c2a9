"""better_compute.benchmarks."""
