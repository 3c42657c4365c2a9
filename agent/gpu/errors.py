"""The one error every GPU source raises."""

from __future__ import annotations


class GpuSourceError(Exception):
    """A GPU source cannot be opened or read.

    The message says what failed and what the operator can do about it (install
    a package, fix a file, or pick another source with BCD_GPU_SOURCE).
    """


class GpuSourceUnavailable(GpuSourceError):
    """The source's library, binary or driver is absent on this machine.

    open_source() falls back to the next source only on this subclass; any other
    GpuSourceError means the source exists but is failing, which must not be
    hidden by silently switching to another one.
    """
