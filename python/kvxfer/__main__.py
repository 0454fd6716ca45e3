# SPDX-License-Identifier: Apache-2.0
"""`python3 -m kvxfer info`: prints kvxfer.info(), one `key: value` a line."""

import sys

import kvxfer


def main(argv: list) -> int:
    if argv != ["info"]:
        print("usage: python3 -m kvxfer info", file=sys.stderr)
        return 2
    for key, value in kvxfer.info().items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
