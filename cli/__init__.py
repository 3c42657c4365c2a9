"""better_compute.cli."""
