"""Factories for reservation tests: pools and adopted nodes (shared with the benchmarks)."""

from better_compute.benchmarks.fleet import add_nodes, build_node, gpu_docs, make_pool

__all__ = ["add_nodes", "build_node", "gpu_docs", "make_pool"]
