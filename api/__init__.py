"""better_compute.api."""
