# SPDX-License-Identifier: Apache-2.0
"""NIXL's ``nixl._utils`` test helpers: raw host buffers by address."""

from __future__ import annotations

import ctypes

_libc = ctypes.CDLL(None, use_errno=True)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


def malloc_passthru(size: int) -> int:
    """The address of `size` new bytes aligned to 4096 (free_passthru frees them)."""
    rounded = -(-int(size) // 4096) * 4096
    addr = _libc.aligned_alloc(4096, max(rounded, 4096))
    if not addr:
        raise MemoryError(f"aligned_alloc of {size} bytes failed")
    return int(addr)


def free_passthru(addr: int) -> None:
    _libc.free(ctypes.c_void_p(addr))


def ba_buf(addr: int, size: int) -> None:
    """Fills `size` bytes at `addr` with 0xba."""
    ctypes.memset(addr, 0xBA, size)


def verify_transfer(addr1: int, addr2: int, size: int) -> None:
    """Asserts the `size` bytes at the two addresses are equal."""
    assert ctypes.string_at(addr1, size) == ctypes.string_at(addr2, size)
