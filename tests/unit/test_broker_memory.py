"""How the broker's allocator settings (broker/memory.py) place a served frame's buffers, in a fresh process.

A fetch frame's buffers (the serialized answer, gRPC's copy of it) are a little over 256 KiB each, made and
freed at every frame. They must come from the heap and stay there when freed: served from a fresh mmap, or
handed back to the OS at the heap's top, every frame faulted in all its pages again. A flood's over-sized
requests must still come from mmap, so that they go back to the OS when freed. glibc's own count of its
mmapped blocks and of the free space at the heap's top (mallinfo2) tells where a buffer went, in a child
process (the settings are process-wide and stay for the process's life).
"""

from __future__ import annotations

import asyncio
import json
import platform
import subprocess
import sys

import pytest

from tidemark.broker import memory

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


# -- when the Trimmer gives memory back after large answers (fetch frames) --------------------------------

async def _until(check, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(memory, "TRIM_INTERVAL_S", 0.2)
    monkeypatch.setattr(memory, "ANSWER_BURST_BYTES", 1000)


def test_a_burst_of_answers_is_trimmed_once_answers_are_quiet(quick):
    async def scenario():
        trims: list[float] = []
        loop = asyncio.get_running_loop()
        trimmer = memory.Trimmer(trim=lambda pad: trims.append(loop.time()) or 1)
        last = loop.time()
        for _ in range(20):  # a read going on for longer than the interval: no trim under its feet
            trimmer.answered(100)
            last = loop.time()
            await asyncio.sleep(0.05)
        assert trims == []
        await _until(lambda: trims)
        assert trims[0] - last >= memory.TRIM_INTERVAL_S  # after the answers went quiet
        await asyncio.sleep(3 * memory.TRIM_INTERVAL_S)
        assert len(trims) == 1
        await trimmer.close()
    asyncio.run(scenario())


def test_answers_below_a_burst_are_not_trimmed(quick):
    async def scenario():
        trims: list[int] = []
        trimmer = memory.Trimmer(trim=lambda pad: trims.append(pad) or 1)
        trimmer.answered(999)
        await asyncio.sleep(3 * memory.TRIM_INTERVAL_S)
        assert trims == []
        trimmer.answered(1)  # the burst is complete: trimmed once quiet
        await _until(lambda: trims)
        await trimmer.close()
    asyncio.run(scenario())


def test_closing_cancels_a_trim_waiting_for_quiet(quick):
    async def scenario():
        trims: list[int] = []
        trimmer = memory.Trimmer(trim=lambda pad: trims.append(pad) or 1)
        trimmer.answered(5000)
        await trimmer.close()
        await asyncio.sleep(3 * memory.TRIM_INTERVAL_S)
        assert trims == []
    asyncio.run(scenario())
