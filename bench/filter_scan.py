"""Filter scan speed: how fast the broker passes over a queue where 1 message in 50 matches, by tag and by SQL92.

    python -m bench.filter_scan                   # 100,000 messages, 1 in 50 matching
    python -m bench.filter_scan --messages 200000 --every 50 --repeat 5

An in-process MessageStore in a temp dir (no gRPC, warm page cache) holds one queue of --messages messages
with a 100-byte body and the properties a producer sets (UNIQ_KEY, KEYS, TAGS and three of the user's); one
in --every has tag "paid", region "eu" and amount 150, the others tag "shipped", region "us" and amount 50.
Each filter then reads the queue from its start to its end the way the broker does, window by window:

- fetch: MessageStore.read_records, as the Fetch stream reads (tags: the vectorised tags-code pass and raw
  records, the client then checks the tag; SQL92: every record's properties decoded and evaluated);
- pull: MessageStore.get_messages, as a pull and a RocketMQ 5 receive read (decoded messages; tags: the
  tags code, then the exact tag).

Prints the best of --repeat runs per filter: milliseconds for the whole queue and messages scanned per second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tidemark.broker.delivery.fetch import MAX_SCAN, MAX_SCAN_PROPERTIES
from tidemark.broker.store import MessageRecord, MessageStore, StoreConfig
from tidemark.common.protocol import ExpressionType, parse_filter, tag_hash

FILTERS = [
    ("tag", "paid", ExpressionType.TAG),
    ("sql92 =", "region = 'eu'", ExpressionType.SQL92),
    ("sql92 AND >", "region = 'eu' AND amount > 100", ExpressionType.SQL92),
    ("sql92 IN", "TAGS IN ('paid', 'refunded')", ExpressionType.SQL92),
]


def records(n: int, every: int) -> list[MessageRecord]:
    out = []
    for i in range(n):
        hit = i % every == every - 1
        tag = "paid" if hit else "shipped"
        props = {"UNIQ_KEY": f"7F0000011F9C18B4AAC2{i:012X}", "KEYS": f"order-{i}", "TAGS": tag,
                 "region": "eu" if hit else "us", "amount": "150" if hit else "50", "customer": f"c{i % 977}"}
        out.append(MessageRecord("T", 0, b"x" * 100, props, tags_code=tag_hash(tag)))
    return out


def scan_fetch(store: MessageStore, n: int, expression: str, kind: str) -> int:
    f = parse_filter(expression, kind)
    exact = f.matches_properties if kind == ExpressionType.SQL92 else None
    offset = found = 0
    while offset < n:
        read = store.read_records("T", 0, offset, max_count=1024, max_bytes=1 << 30, tags_codes=f.code_filter,
                                  properties_filter=exact, max_scan=MAX_SCAN if exact is None else MAX_SCAN_PROPERTIES)
        found += read.count
        offset = read.next_offset
    return found


def scan_pull(store: MessageStore, n: int, expression: str, kind: str) -> int:
    f = parse_filter(expression, kind)
    sql = kind == ExpressionType.SQL92
    offset = found = 0
    while offset < n:  # as PullService._read and PopService._take_queue call it
        got = store.get_messages("T", 0, offset, 32, matcher=None if sql else f.matches_code,
                                 exact_matcher=None if sql else (lambda m: f.matches_tag(m.tags)),
                                 properties_filter=f.matches_properties if sql else None,
                                 max_scan=MAX_SCAN_PROPERTIES if sql else MAX_SCAN)
        found += len(got.messages)
        offset = got.next_begin_offset
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=50, help="one message in this many matches")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    async def fill(store: MessageStore) -> None:
        await store.start()
        batch = records(args.messages, args.every)
        for i in range(0, len(batch), 1000):
            await store.put_messages(batch[i:i + 1000])

    with tempfile.TemporaryDirectory() as tmp:
        store = MessageStore(StoreConfig(Path(tmp) / "store", flush_interval_ms=3_600_000))
        store.load()
        asyncio.run(fill(store))
        expected = args.messages // args.every
        print(f"{args.messages} messages, 1 in {args.every} matching ({expected}); best of {args.repeat}")
        print(f"{'path':6} {'filter':12} {'expression':34} {'ms':>8} {'msgs/s':>12}")
        for path, scan in (("fetch", scan_fetch), ("pull", scan_pull)):
            for name, expression, kind in FILTERS:
                best = float("inf")
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    found = scan(store, args.messages, expression, kind)
                    best = min(best, time.perf_counter() - start)
                    assert found == expected, (name, found, expected)
                print(f"{path:6} {name:12} {expression:34} {best * 1000:8.1f} {args.messages / best:12,.0f}")
        asyncio.run(store.shutdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
