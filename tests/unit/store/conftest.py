"""Fixtures for the message store tests.

The store's API is async and pytest-asyncio is not installed: each test runs
its scenario with asyncio.run(). One asyncio.run() stands for one broker
process. A crash (kill -9) is simulated by abandoning a store without
shutdown(): its writes sit in the page cache, so a new store on the same
directory sees exactly what a killed process leaves behind, abort file and
stale checkpoint included.

The default config uses tiny segments (4 KiB) and consume-queue files
(8 entries) so a few dozen messages cross many file boundaries, and a flush
interval of an hour so no periodic flush moves the checkpoint during a test
unless the test asks for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from store_testlib import body_for

from tidemark.broker.store import MessageRecord, MessageStore, RecoveryReport, StoreConfig


class FakeClock:
    """Store timestamps that advance by `step` ms on every read."""

    def __init__(self, start: int = 1_700_000_000_000, step: int = 10) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


@pytest.fixture
def config(tmp_path) -> StoreConfig:
    return StoreConfig(
        tmp_path / "store",
        commitlog_segment_size=4096,
        consume_queue_entries_per_file=8,
        flush_interval_ms=3_600_000,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_store(config, clock) -> Callable[..., tuple[MessageStore, RecoveryReport]]:
    """open_store(**config_overrides) -> (loaded store, its recovery report); start() is up to the test."""

    def open_(**overrides) -> tuple[MessageStore, RecoveryReport]:
        store = MessageStore(dataclasses.replace(config, **overrides), clock=clock)
        return store, store.load()

    return open_


@pytest.fixture
def make_records() -> Callable[..., list[MessageRecord]]:
    """make_records(n, start=0, topic="T", queue_id=0, tag=None) -> records with body_for(i)."""

    def make(
        n: int, *, start: int = 0, topic: str = "T", queue_id: int = 0, tag: str | None = None
    ):
        props = {"TAGS": tag} if tag else {}
        return [
            MessageRecord(
                topic, queue_id, body_for(i), {**props, "KEYS": f"k{i}"}, born_timestamp=i
            )
            for i in range(start, start + n)
        ]

    return make
