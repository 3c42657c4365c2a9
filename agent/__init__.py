"""better_compute.agent."""
