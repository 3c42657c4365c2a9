"""better_compute.projections."""
