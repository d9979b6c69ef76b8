"""How the broker's allocator settings (broker/memory.py) place a served frame's buffers, in a fresh process.

A fetch frame's buffers (the serialized answer, gRPC's copy of it) are a little over 256 KiB each, made and
freed at every frame. They must come from the heap and stay there when freed: served from a fresh mmap, or
handed back to the OS at the heap's top, every frame faulted in all its pages again. A flood's over-sized
requests must still come from mmap, so that they go back to the OS when freed. glibc's own count of its
mmapped blocks and of the free space at the heap's top (mallinfo2) tells where a buffer went, in a child
process (the settings are process-wide and stay for the process's life).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

CHILD = r"""
import ctypes, json
from tidemark.broker import memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mmapped():
    return libc.mallinfo2().hblks

memory.configure()
seen = {}
before = mmapped()
frame = bytearray(256 * 1024 + 300)  # a fetch frame's answer: 256 KiB of records and its framing
seen["frame_mmapped"] = mmapped() - before
del frame
seen["top_kept"] = libc.mallinfo2().keepcost  # the heap's free top after the frame went
before = mmapped()
flood = bytearray(16 * 1024 * 1024)  # a request over the default limit
seen["flood_mmapped"] = mmapped() - before
del flood
seen["flood_left"] = mmapped() - before
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_frame_sized_buffer_comes_from_the_heap(seen):
    assert seen["frame_mmapped"] == 0, seen


def test_a_freed_frame_stays_at_the_heap_top_for_the_next(seen):
    assert seen["top_kept"] >= 256 * 1024, seen  # glibc's default trim gives back all but 128 KiB


def test_an_over_sized_request_still_comes_from_mmap_and_goes_back(seen):
    assert seen["flood_mmapped"] == 1 and seen["flood_left"] == 0, seen
