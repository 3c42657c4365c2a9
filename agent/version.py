"""bcd's version: stamped by scripts/build-bcd into the single file, else the installed one."""

from __future__ import annotations

from importlib import metadata


def bcd_version() -> str:
    try:
        from ._build import VERSION  # written by the build

        return str(VERSION)
    except ImportError:
        pass
    try:
        return metadata.version("better-compute")
    except metadata.PackageNotFoundError:
        return "0+unknown"
