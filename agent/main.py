"""bcd, the node agent (join, node, status, doctor arrive with their issues)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("bcd: no commands yet (join, node, status and doctor are being built)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
