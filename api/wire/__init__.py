"""Wire schemas shared by the control plane and bcd.

These modules import only msgspec and the standard library (never Starlette,
never domain/ but its standard-library-only table of GPU models, domain/gpu_models.py, which
bcd ships too), because bcd, which runs on the nodes, imports them too.
Messages between agent and server tolerate unknown fields, so either side can
be upgraded first.
"""
