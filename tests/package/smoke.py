# SPDX-License-Identifier: Apache-2.0
"""An installed kvxfer, used as a user would: run from a directory that holds
no kvxfer, it must import from the install under test, report the version it
was built as, load its C++ library from that install, and move bytes.

    python smoke.py INSTALL_ROOT VERSION

INSTALL_ROOT: the venv or extracted package root the package, its extension
and libkvxfer must all come from (never a build tree, never /usr/lib).
"""

import os
import sys

import numpy as np

import kvxfer


def main(root: str, version: str) -> int:
    root = os.path.realpath(root)
    info = kvxfer.info()
    print("\n".join(f"{key}: {value}" for key, value in info.items()))
    for key in ("package", "extension", "library"):
        where = os.path.realpath(info[key])
        assert where.startswith(root + os.sep), f"{key} {where} is not under {root}"
    assert kvxfer.__version__ == version, f"__version__ {kvxfer.__version__}, expected {version}"

    # One write over the loopback engine: the blocks must land, byte for byte.
    src = np.random.default_rng(7).integers(0, 256, (16, 256), dtype=np.uint8)
    dst = np.zeros_like(src)
    a = kvxfer.Transport("smoke-a", memoryview(src), backends=["LOOPBACK"])
    b = kvxfer.Transport("smoke-b", memoryview(dst), backends=["LOOPBACK"])
    a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
    tid = a.write_blocks("b", np.array([0, 1, 2], np.int64), np.array([13, 14, 15], np.int64))
    for _ in range(100000):
        result = a.poll("b")
        assert not result.failed and result.peer_fault is None, result
        if tid in result.done:
            break
    else:
        raise AssertionError(f"transfer {tid} never completed")
    assert (dst[13:16] == src[0:3]).all() and not dst[:13].any()
    a.close()
    b.close()
    print(f"smoke: kvxfer {version} from {info['package']}: 3 blocks written and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
