# SPDX-License-Identifier: Apache-2.0
"""The kvxfer command from the Python package.

`kvxfer ARGS` (the console script pip installs) and `python3 -m kvxfer ARGS`
run the C++ `kvxfer` tool with ARGS: the one shipped inside the package
(kvxfer/bin/kvxfer: the wheel's, or the build tree's), else one on PATH (the
Debian package `kvxfer`). `info` first prints kvxfer.info(), one `key: value`
a line (where this Python package, its extension and libkvxfer come from),
then the tool's own `info`.
"""

import os
import shutil
import sys
from typing import Optional

import kvxfer


_NO_TOOL = "not installed (the Debian package kvxfer has it; pip install . builds it)"


def tool_path() -> Optional[str]:
    """The kvxfer tool this package runs, or None when there is none."""
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kvxfer")
    if os.access(bundled, os.X_OK):
        return bundled
    # Only a program, never a script: the console script is named kvxfer
    # too, and running it would run this again.
    found = shutil.which("kvxfer")
    if found is not None:
        with open(found, "rb") as file:
            if file.read(4) == b"\x7fELF":
                return found
    return None


def main(argv: list) -> int:
    tool = tool_path()
    if argv[:1] == ["info"]:
        for key, value in kvxfer.info().items():
            print(f"{key}: {value}")
        print(f"tool: {tool or _NO_TOOL}")
        if tool is None:
            return 0
    if tool is None:
        print(
            "kvxfer: the kvxfer tool is not installed with this package (pip install . builds "
            "it into the package; Debian: apt install kvxfer). Without it: python3 -m kvxfer info",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(tool, ["kvxfer", *argv])
    return 1  # not reached


def console() -> None:
    """The `kvxfer` console script."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    console()
