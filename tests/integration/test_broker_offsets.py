"""The broker's consumer offset manager over gRPC: commits, persistence, crashes, resets, fencing, stats.

Real broker processes; raw tidemark.v1 stubs so status codes and messages are
checked as clients receive them. consumerOffset.json is read straight from the
data dir to check what reached the disk.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs, free_port
from workload import metric, wait_until

from tidemark.client.message import MessageQueue
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.types import CommitOffsetsResult, OffsetCommit
from tidemark.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    offsets_pb2,
)

TIMEOUT = 15
IA, NF, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION


class Api(BrokerStubs):
    def topic_with_messages(self, topic: str, per_queue: list[int]) -> list[list[int]]:
        """Create a topic and fill queue i with per_queue[i] messages; returns store timestamps per queue."""
        self.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=topic, queue_nums=len(per_queue)), timeout=TIMEOUT)
        for q, n in enumerate(per_queue):
            for start in range(0, n, 500):
                self.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                    topic=topic, queue_id=q,
                    messages=[common_pb2.Message(body=b"m%d" % i) for i in range(start, min(n, start + 500))]),
                    timeout=TIMEOUT)
        return [[] for _ in per_queue]

    def send(self, topic: str, queue_id: int, n: int):
        return self.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=b"x%d" % i) for i in range(n)]),
            timeout=TIMEOUT).results

    def commit(self, group: str, topic: str, queue_id: int, offset: int, fence: common_pb2.CommitFence | None = None):
        c = offsets_pb2.OffsetCommit(group=group, topic=topic, queue_id=queue_id, offset=offset, fence=fence)
        return self.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(commit=c), timeout=TIMEOUT)

    def query(self, group: str, topic: str, queue_id: int) -> int:
        return self.query_full(group, topic, queue_id).offset

    def query_full(self, group: str, topic: str, queue_id: int):
        return self.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
            group=group, topic=topic, queue_id=queue_id), timeout=TIMEOUT)

    def reset(self, group: str, topic: str, *, queue_id: int | None = None, dry_run: bool = False, **target):
        req = offsets_pb2.ResetOffsetRequest(group=group, topic=topic, dry_run=dry_run, **target)
        if queue_id is not None:
            req.queue_id = queue_id
        return self.offsets.ResetOffset(req, timeout=TIMEOUT)

    def stats(self, group: str, topic: str = ""):
        return self.offsets.GetConsumeStats(offsets_pb2.GetConsumeStatsRequest(group=group, topic=topic),
                                            timeout=TIMEOUT)

    def pull(self, group: str, topic: str, queue_id: int, offset: int, **kw):
        return self.messaging.PullMessage(messaging_pb2.PullMessageRequest(
            group=group, topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=4, **kw), timeout=TIMEOUT)


def expect_error(call, request, code: grpc.StatusCode, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=TIMEOUT)
    assert info.value.code() == code, f"expected {code}, got {info.value.code()}: {info.value.details()}"
    for fragment in fragments:
        assert fragment in info.value.details(), f"{fragment!r} not in {info.value.details()!r}"


def offset_file(broker: BrokerProcess) -> Path:
    return broker.data_dir / "config" / "consumerOffset.json"


def read_table(path: Path) -> dict | None:
    """The offsetTable in a file, or None when it does not exist yet."""
    try:
        return json.loads(path.read_bytes())["offsetTable"]
    except FileNotFoundError:
        return None


def entries(path: Path) -> int:
    table = read_table(path) or {}
    return sum(len(q) for q in table.values())


def rocketmq_text(doc: dict) -> str:
    # RocketMQ's fastjson pretty print: 4-space indent, ", " before each newline, no trailing newline.
    return json.dumps(doc, indent=4, separators=(", ", ": "))


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("offsets") / "data").start()
    yield b
    b.kill()


@pytest.fixture(scope="module")
def api(shared) -> Api:
    with Api(shared.address) as a:
        yield a


# -- persistence and crashes ---------------------------------------------------------

INTERVAL_MS = 2000


def test_commit_then_kill_before_and_after_the_persist_interval(broker_factory):
    broker = broker_factory(args=("--flush-consumer-offset-interval-ms", str(INTERVAL_MS)))
    path = offset_file(broker)
    with Api(broker.address) as api:
        api.topic_with_messages("crash", [100, 100])
        api.commit("g", "crash", 0, 10)
        api.commit("g", "crash", 1, 20)
        # After the interval: the timer wrote the file (RocketMQ's shape, exactly, plus the offset
        # journal's mark: the first journal segment the file does not hold).
        wait_until(lambda: read_table(path) is not None, INTERVAL_MS / 1000 + 5, "the first offset persist")
        first_persist = time.monotonic()
        mark = json.loads(path.read_text())["offsetJournalFrom"]
        assert isinstance(mark, int) and mark > 0
        doc = {"offsetTable": {"crash@g": {"0": 10, "1": 20}}, "offsetJournalFrom": mark}
        assert path.read_text() == rocketmq_text(doc)
        # Within the interval: these commits are not on disk yet when the broker dies.
        api.commit("g", "crash", 0, 55)
        api.commit("other", "crash", 1, 7)
    broker.kill()
    assert time.monotonic() - first_persist < INTERVAL_MS / 1000, "test too slow: the next persist may have run"
    assert path.read_text() == rocketmq_text(doc)

    broker.start()
    assert "source=json" in broker.log_text()
    with Api(broker.address) as api:
        # The last persisted state plus the offset journal replayed on top: nothing applied is lost.
        assert (api.query("g", "crash", 0), api.query("g", "crash", 1)) == (55, 20)
        assert api.query("other", "crash", 1) == 7
        api.commit("g", "crash", 0, 60)
        api.commit("g", "crash", 1, 70)
        wait_until(lambda: read_table(path) == {"crash@g": {"0": 60, "1": 70}, "crash@other": {"1": 7}},
                   INTERVAL_MS / 1000 + 5,
                   "the second offset persist")
    broker.kill()
    # The previous file was kept as .bak; no temp file is left behind.
    assert read_table(path.with_name("consumerOffset.json.bak")) == {"crash@g": {"0": 10, "1": 20}}
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]

    broker.start()
    with Api(broker.address) as api:
        # Killed after the interval: the newest commits survived, not the older .bak state.
        assert (api.query("g", "crash", 0), api.query("g", "crash", 1)) == (60, 70)


def test_persist_only_when_the_table_changed(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--flush-consumer-offset-interval-ms", "200", "--metrics-port", str(port)))
    path = offset_file(broker)

    def persist_runs() -> float:
        return metric(port, "tidemark_scheduler_job_runs_total", job="persist-consumer-offsets")

    with Api(broker.address) as api:
        api.topic_with_messages("dirty", [10])
        api.commit("g", "dirty", 0, 3)
        wait_until(lambda: read_table(path) == {"dirty@g": {"0": 3}}, 10, "the persist")
        mtime = path.stat().st_mtime_ns
        api.commit("g", "dirty", 0, 3)  # same value: nothing changed
        runs = persist_runs()
        wait_until(lambda: persist_runs() >= runs + 3, 10, "three more runs of the persist job")
        assert path.stat().st_mtime_ns == mtime
        assert not path.with_name("consumerOffset.json.bak").exists()  # a second write would have made one
        api.commit("g", "dirty", 0, 4)
        wait_until(lambda: read_table(path) == {"dirty@g": {"0": 4}}, 10, "the persist of a change")


def test_sigterm_persists_the_latest_commits(broker_factory):
    broker = broker_factory(args=("--flush-consumer-offset-interval-ms", "600000"))
    with Api(broker.address) as api:
        api.topic_with_messages("term", [50, 50])
        api.commit("g", "term", 0, 11)
        api.offsets.CommitOffsets(iter([offsets_pb2.CommitOffsetsRequest(commits=[
            offsets_pb2.OffsetCommit(group="g", topic="term", queue_id=1, offset=22),
            offsets_pb2.OffsetCommit(group="g2", topic="term", queue_id=0, offset=33)])]), timeout=TIMEOUT)
        # A pull's piggybacked commit counts too.
        assert api.pull("g2", "term", 1, 44, commit_offset=44).status == messaging_pb2.FOUND
    assert read_table(offset_file(broker)) is None  # the timer never ran
    assert broker.stop() == 0
    assert read_table(offset_file(broker)) == {"term@g": {"0": 11, "1": 22}, "term@g2": {"0": 33, "1": 44}}
    broker.start()
    with Api(broker.address) as api:
        assert [api.query("g", "term", q) for q in (0, 1)] == [11, 22]
        assert [api.query("g2", "term", q) for q in (0, 1)] == [33, 44]


def test_kill_during_the_write_of_a_large_table_never_leaves_a_torn_file(broker_factory):
    # 100,000 entries (1,000 topic@group keys x 100 queues) written every 100 ms: a write takes a
    # good part of that, and the kill is timed to land while the temp file is being written.
    broker = broker_factory(args=("--flush-consumer-offset-interval-ms", "100"))
    path = offset_file(broker)
    tmp = path.with_name(f".{path.name}.tmp")
    topics, groups, queues = 10, 100, 100
    with Api(broker.address) as api:
        for t in range(topics):
            api.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=f"big{t}", queue_nums=queues), timeout=TIMEOUT)
        api.send("big0", 0, 1)
        batches = [offsets_pb2.CommitOffsetsRequest(commits=[
            offsets_pb2.OffsetCommit(group=f"g{g}", topic=f"big{t}", queue_id=q, offset=0) for q in range(queues)])
            for g in range(groups) for t in range(topics)]
        assert api.offsets.CommitOffsets(iter(batches), timeout=120).applied == topics * groups * queues
        # Writes during the seeding hold part of the table; wait until both files hold all of it.
        bak = path.with_name("consumerOffset.json.bak")
        for value in (1, 0):
            api.commit("g0", "big0", 0, value)
            wait_until(lambda v=value: entries(path) == topics * groups * queues
                       and read_table(path)["big0@g0"]["0"] == v, 20, "a persist of the whole table")
        assert entries(bak) == topics * groups * queues
    for _round in range(3):
        with Api(broker.address) as api:
            value = [0]

            def persisting(api=api, value=value) -> bool:
                # Keep the table changing, so a persist is always due: one commit, then one look, could
                # miss the only write it caused on a loaded machine and then wait for nothing.
                if tmp.exists():
                    return True
                value[0] ^= 1
                api.commit("g0", "big0", 0, value[0])
                return tmp.exists()
            wait_until(persisting, 20, "a persist in progress", interval=0.001)
            broker.kill()
        # Whatever the moment, the file in place is a whole table, and so is the .bak.
        assert entries(path) == entries(bak) == topics * groups * queues
        broker.start()
        assert f"source=json file={path} entries={topics * groups * queues}" in broker.log_text()
        with Api(broker.address) as api:
            assert api.query("g99", "big9", 99) == 0


def _write_offsets(broker: BrokerProcess, table: dict) -> None:
    offset_file(broker).write_text(rocketmq_text({"offsetTable": table}))


def test_corrupt_offset_file_falls_back_to_bak_or_refuses_to_start(broker_factory):
    broker = broker_factory(args=("--flush-consumer-offset-interval-ms", "600000"))
    path = offset_file(broker)
    bak = path.with_name("consumerOffset.json.bak")
    with Api(broker.address) as api:
        api.topic_with_messages("bak", [100])
        api.commit("g", "bak", 0, 40)
    assert broker.stop() == 0  # file: 40
    broker.start()
    with Api(broker.address) as api:
        api.commit("g", "bak", 0, 90)
    assert broker.stop() == 0  # file: 90, .bak: 40
    assert read_table(bak) == {"bak@g": {"0": 40}}

    # A torn main file with a good .bak: the broker starts from the .bak and says so.
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    broker.start()
    log = broker.log_text()
    assert "loaded consumer offsets from the backup" in log and "source=bak" in log
    with Api(broker.address) as api:
        assert api.query("g", "bak", 0) == 40
    broker.kill()
    assert path.with_name("consumerOffset.json.corrupt").read_bytes() == data[: len(data) // 2]

    # A damaged file and no usable .bak: refuse to start, with a message naming the file and the way out.
    damaged = '{"offsetTable": {"bak@g": {"0": 4'
    path.write_text(damaged)
    bak.unlink(missing_ok=True)
    for _ in range(2):  # and keep refusing: the failed start must not have replaced the evidence
        proc = subprocess.run(broker.command(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert "consumerOffset.json" in proc.stderr and "Refusing to start" in proc.stderr, proc.stderr
        assert "--force-empty-offsets" in proc.stderr
        assert "broker_ready" not in proc.stdout + proc.stderr
        assert path.read_text() == damaged and not bak.exists()

    # The explicit flag starts empty (and says so loudly).
    forced = BrokerProcess(broker.data_dir, port=broker.port, args=("--force-empty-offsets",))
    forced.start()
    try:
        assert "starting with NO consumer offsets" in forced.log_text()
        with Api(forced.address) as api:
            assert api.query("g", "bak", 0) == -1
    finally:
        forced.kill()

    # Malformed entries are skipped with a warning naming them; the rest loads.
    _write_offsets(broker, {"bak@g": {"0": 12, "1": "seven"}, "no-at-sign": {"0": 1}, "bak@h": {"0": 5}})
    broker.start()
    log = broker.log_text()
    assert "'no-at-sign'" in log and "'seven'" in log
    with Api(broker.address) as api:
        assert (api.query("g", "bak", 0), api.query("h", "bak", 0)) == (12, 5)


# -- the commit stream -----------------------------------------------------------------


def test_ten_thousand_oneway_commits_apply_in_order(api: Api):
    queues = 4
    api.topic_with_messages("stream", [1000] * queues)
    rng = random.Random(7)
    commits = [offsets_pb2.OffsetCommit(group=f"sg{i % 2}", topic="stream", queue_id=rng.randrange(queues),
                                        offset=rng.randrange(1001)) for i in range(10_000)]
    last: dict[tuple[str, int], int] = {}
    for c in commits:
        last[(c.group, c.queue_id)] = c.offset
    batches = [offsets_pb2.CommitOffsetsRequest(commits=commits[i:i + 64]) for i in range(0, len(commits), 64)]
    resp = api.offsets.CommitOffsets(iter(batches), timeout=60)
    assert (resp.applied, resp.rejected, list(resp.rejections)) == (10_000, 0, [])
    assert len(last) == 2 * queues
    for (group, q), offset in last.items():
        assert api.query(group, "stream", q) == offset


def test_the_client_commit_stream_gathers_writes_into_few_messages_in_order(api: Api, shared):
    api.topic_with_messages("gather", [300] * 4)

    async def run() -> tuple[list[int], CommitOffsetsResult]:
        conn = BrokerConnection(shared.address, timeout_s=TIMEOUT)
        try:
            await conn.broker_info()
            mqs = [MessageQueue("gather", conn.broker_name, q) for q in range(4)]
            stream = conn.open_commit_stream(timeout=60)
            sizes: list[int] = []
            write = stream._call.write
            stream._call.write = lambda request: (sizes.append(len(request.commits)), write(request))[1]
            for offset in range(1, 300):  # a later commit of a queue must win: order is kept
                await stream.write([OffsetCommit("gg", mq, offset) for mq in mqs])
            await stream.write([OffsetCommit("gg", mqs[0], 300, client_id="c-1", reset_generation=0),  # fenced
                                OffsetCommit("gg", MessageQueue("nope", conn.broker_name, 0), 1)])
            return sizes, await stream.close()
        finally:
            await conn.close()

    sizes, result = asyncio.run(run())
    assert (result.applied, result.rejected) == (4 * 299 + 1, 1)
    assert "does not exist" in result.rejections[0].message
    assert sum(sizes) == 4 * 299 + 2 and len(sizes) <= 2  # 1,198 commits written without a pause: 2 messages
    assert [api.query("gg", "gather", q) for q in range(4)] == [300, 299, 299, 299]


def test_commit_stream_reports_bad_commits_and_applies_the_rest(api: Api):
    api.topic_with_messages("stream-bad", [10])
    C = offsets_pb2.OffsetCommit
    batch = [C(group="sb", topic="stream-bad", queue_id=0, offset=3),
             C(group="sb", topic="nope", queue_id=0, offset=1),
             C(group="bad group", topic="stream-bad", queue_id=0, offset=1),
             C(group="sb", topic="stream-bad", queue_id=0, offset=11),
             C(group="sb", topic="stream-bad", queue_id=0, offset=6)]
    resp = api.offsets.CommitOffsets(iter([offsets_pb2.CommitOffsetsRequest(commits=batch)]), timeout=TIMEOUT)
    assert (resp.applied, resp.rejected) == (2, 3)
    assert [(r.commit.topic, r.commit.group, r.reason) for r in resp.rejections] == [
        ("nope", "sb", offsets_pb2.INVALID), ("stream-bad", "bad group", offsets_pb2.INVALID),
        ("stream-bad", "sb", offsets_pb2.INVALID)]
    assert "does not exist" in resp.rejections[0].message
    assert "above the max offset" in resp.rejections[2].message
    assert api.query("sb", "stream-bad", 0) == 6


# -- reset and fencing ---------------------------------------------------------------


def test_reset_by_timestamp_dry_run_then_execute(api: Api):
    api.topic_with_messages("rst", [0, 0])
    for q in (0, 1):
        api.send("rst", q, 10)
    last = max(api.pull("", "rst", q, 9).messages[0].store_timestamp for q in (0, 1))
    wait_until(lambda: time.time_ns() // 1_000_000 > last, 5, "the clock to pass the first sends")
    boundary = [api.send("rst", q, 5)[0] for q in (0, 1)]
    stamp = api.pull("", "rst", 0, boundary[0].queue_offset).messages[0].store_timestamp
    assert api.pull("", "rst", 0, 9).messages[0].store_timestamp < stamp
    for q in (0, 1):
        api.commit("rg", "rst", q, 15)

    dry = api.reset("rg", "rst", timestamp=stamp, dry_run=True)
    assert not dry.applied
    assert [(c.queue.queue_id, c.queue.broker_name, c.old_offset, c.new_offset) for c in dry.changes] == \
        [(0, "broker-a", 15, 10), (1, "broker-a", 15, 10)]
    assert [api.query("rg", "rst", q) for q in (0, 1)] == [15, 15]
    assert api.query_full("rg", "rst", 0).reset_generation == 0

    done = api.reset("rg", "rst", timestamp=stamp)
    assert done.applied and [c.new_offset for c in done.changes] == [10, 10]
    assert [api.query("rg", "rst", q) for q in (0, 1)] == [10, 10]

    # The other targets, one queue at a time.
    assert api.reset("rg", "rst", queue_id=1, to_earliest=True).changes[0].new_offset == 0
    assert api.reset("rg", "rst", queue_id=1, to_latest=True).changes[0].new_offset == 15
    assert api.reset("rg", "rst", queue_id=1, offset=4).changes[0].new_offset == 4
    assert api.reset("rg", "rst", queue_id=1, shift_by=-10).changes[0].new_offset == 0  # clamped to min
    assert api.reset("rg", "rst", queue_id=1, shift_by=7).changes[0].new_offset == 7
    assert [api.query("rg", "rst", q) for q in (0, 1)] == [10, 7]
    # A timestamp later than everything: the max offset.
    assert api.reset("rg", "rst", queue_id=0, timestamp=stamp + 3_600_000).changes[0].new_offset == 15


def test_reset_wins_over_a_commit_from_a_consumer_that_had_not_seen_it(api: Api):
    api.topic_with_messages("fence", [30])
    seen = api.query_full("fg", "fence", 0).reset_generation
    api.commit("fg", "fence", 0, 12, common_pb2.CommitFence(client_id="c1", reset_generation=seen))
    reset = api.reset("fg", "fence", queue_id=0, offset=5)
    assert (reset.changes[0].old_offset, reset.changes[0].new_offset) == (12, 5)
    generation = api.query_full("fg", "fence", 0).reset_generation
    assert generation > seen

    stale = common_pb2.CommitFence(client_id="c1", reset_generation=seen)
    expect_error(api.offsets.UpdateConsumerOffset, offsets_pb2.UpdateConsumerOffsetRequest(
        commit=offsets_pb2.OffsetCommit(group="fg", topic="fence", queue_id=0, offset=20, fence=stale)),
        FP, "reset by an admin", "continue from the reset offset 5")
    assert api.query("fg", "fence", 0) == 5
    # The stale consumer's next pull is told where to continue, and its piggybacked commit is dropped.
    pulled = api.pull("fg", "fence", 0, 20, fence=stale, commit_offset=20)
    assert pulled.status == messaging_pb2.OFFSET_RESET and not pulled.messages
    assert (pulled.next_begin_offset, pulled.reset_generation) == (5, generation)
    assert api.query("fg", "fence", 0) == 5
    # Stale commits over the oneway stream are rejected too.
    resp = api.offsets.CommitOffsets(iter([offsets_pb2.CommitOffsetsRequest(commits=[offsets_pb2.OffsetCommit(
        group="fg", topic="fence", queue_id=0, offset=21, fence=stale)])]), timeout=TIMEOUT)
    assert (resp.applied, resp.rejected, resp.rejections[0].reason) == (0, 1, offsets_pb2.STALE_RESET_GENERATION)
    assert api.query("fg", "fence", 0) == 5
    # Once it adopts the new generation it commits normally; unfenced commits keep RocketMQ's last-write-wins.
    api.commit("fg", "fence", 0, 8, common_pb2.CommitFence(client_id="c1", reset_generation=generation))
    assert api.query("fg", "fence", 0) == 8
    api.commit("fg", "fence", 0, 6)
    assert api.query("fg", "fence", 0) == 6


def test_dry_run_reset_of_a_new_group_creates_nothing(api: Api):
    api.topic_with_messages("dry-new", [3])
    dry = api.reset("newbie", "dry-new", to_latest=True, dry_run=True)
    assert [(c.old_offset, c.new_offset) for c in dry.changes] == [(-1, 3)]
    assert api.query("newbie", "dry-new", 0) == -1
    listed = api.admin.ListGroups(admin_pb2.ListGroupsRequest(topic="dry-new"), timeout=TIMEOUT)
    assert [g.group for g in listed.groups] == []


# -- consume stats --------------------------------------------------------------------


def test_consume_stats_lag_is_max_minus_committed(api: Api):
    api.topic_with_messages("lag", [7, 5, 4, 0])
    api.commit("lg", "lag", 0, 3)
    api.commit("lg", "lag", 1, 5)
    api.commit("lg", "lag", 3, 0)
    stats = api.stats("lg", "lag")
    rows = [(s.queue.topic, s.queue.broker_name, s.queue.queue_id, s.min_offset, s.max_offset, s.consumer_offset,
             s.lag) for s in stats.queues]
    assert rows == [("lag", "broker-a", 0, 0, 7, 3, 4), ("lag", "broker-a", 1, 0, 5, 5, 0),
                    ("lag", "broker-a", 2, 0, 4, -1, 4), ("lag", "broker-a", 3, 0, 0, 0, 0)]
    assert stats.total_lag == 8
    # last_timestamp: store time of the last consumed message (offset committed - 1).
    consumed = api.pull("", "lag", 0, 2).messages[0]
    assert stats.queues[0].last_timestamp == consumed.store_timestamp
    assert stats.queues[2].last_timestamp == 0
    # Lag follows new messages and new commits.
    api.send("lag", 1, 6)
    api.commit("lg", "lag", 0, 7)
    after = {s.queue.queue_id: s.lag for s in api.stats("lg", "lag").queues}
    assert after == {0: 0, 1: 6, 2: 4, 3: 0}
    # Without a topic: every topic the group has offsets for.
    assert {s.queue.topic for s in api.stats("lg").queues} == {"lag"}
    expect_error(api.offsets.GetConsumeStats, offsets_pb2.GetConsumeStatsRequest(group="never-seen"), NF,
                 "'never-seen' has no offsets")
    expect_error(api.offsets.GetConsumeStats, offsets_pb2.GetConsumeStatsRequest(group="lg", topic="nope"), NF,
                 "'nope' does not exist")


# -- bad input --------------------------------------------------------------------------


def test_bad_commits_are_refused_and_store_nothing(api: Api):
    api.topic_with_messages("badc", [10, 10])
    update = api.offsets.UpdateConsumerOffset

    def req(group="bg", topic="badc", queue_id=0, offset=1):
        return offsets_pb2.UpdateConsumerOffsetRequest(commit=offsets_pb2.OffsetCommit(
            group=group, topic=topic, queue_id=queue_id, offset=offset))

    expect_error(update, req(topic="no-such"), NF, "topic 'no-such' does not exist")
    expect_error(update, req(topic="bad topic"), IA, "topic name 'bad topic' may only contain")
    expect_error(update, req(group="bad group!"), IA, "group name 'bad group!' may only contain")
    expect_error(update, req(group="g" * 256), IA, "at most 255")
    expect_error(update, req(group=""), IA, "group name must not be empty")
    expect_error(update, req(queue_id=2), IA, "queue id 2 is out of range for topic 'badc' (queues 0..1)")
    expect_error(update, req(queue_id=-1), IA, "queue id -1 is out of range")
    expect_error(update, req(offset=-1), IA, "offset must be >= 0, got -1")
    expect_error(update, req(offset=11), IA, "offset 11 is above the max offset 10 of badc:0")
    for q in (0, 1):
        assert api.query("bg", "badc", q) == -1
    listed = api.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=TIMEOUT)
    assert "bg" not in [g.group for g in listed.groups]
    # The boundaries themselves are fine: 0 and the max offset (everything consumed).
    api.commit("bg", "badc", 0, 10)
    api.commit("bg", "badc", 1, 0)
    assert [api.query("bg", "badc", q) for q in (0, 1)] == [10, 0]

    query = api.offsets.QueryConsumerOffset
    Q = offsets_pb2.QueryConsumerOffsetRequest
    expect_error(query, Q(group="", topic="badc", queue_id=0), IA, "group name must not be empty")
    expect_error(query, Q(group="bg", topic="no-such", queue_id=0), NF, "does not exist")
    expect_error(query, Q(group="bg", topic="badc", queue_id=5), IA, "queue id 5 is out of range")

    reset = api.offsets.ResetOffset
    R = offsets_pb2.ResetOffsetRequest
    expect_error(reset, R(group="bg", topic="badc"), IA, "a reset needs a target")
    expect_error(reset, R(group="bg", topic="no-such", to_earliest=True), NF, "does not exist")
    expect_error(reset, R(group="", topic="badc", to_earliest=True), IA, "group name must not be empty")
    expect_error(reset, R(group="bg", topic="badc", queue_id=9, to_earliest=True), IA, "queue id 9 is out of range")
    expect_error(reset, R(group="bg", topic="badc", offset=11), IA, "offset 11 is outside [0, 10]")
    expect_error(reset, R(group="bg", topic="badc", offset=-2), IA, "offset -2 is outside")
    expect_error(reset, R(group="bg", topic="badc", timestamp=-1), IA, "timestamp must be >= 0")
    expect_error(reset, R(group="bg", topic="badc", to_latest=False), IA, "to_latest must be true")
    assert [api.query("bg", "badc", q) for q in (0, 1)] == [10, 0]
    assert api.query_full("bg", "badc", 0).reset_generation == 0


def test_deleting_a_topic_removes_its_offsets(api: Api, shared):
    api.topic_with_messages("gone", [5, 5])
    api.topic_with_messages("kept", [5])
    api.commit("dg", "gone", 0, 3)
    api.commit("dg2", "gone", 1, 4)
    api.commit("dg", "kept", 0, 2)
    api.admin.DeleteTopic(admin_pb2.DeleteTopicRequest(name="gone"), timeout=TIMEOUT)
    listed = api.admin.ListGroups(admin_pb2.ListGroupsRequest(topic="kept"), timeout=TIMEOUT)
    assert [(g.group, list(g.topics)) for g in listed.groups] == [("dg", ["kept"])]
    # A re-created topic starts empty, with no offsets from its earlier life.
    api.topic_with_messages("gone", [1, 1])
    assert [api.query(g, "gone", q) for g in ("dg", "dg2") for q in (0, 1)] == [-1, -1, -1, -1]
    assert api.query("dg", "kept", 0) == 2
    assert {s.queue.topic for s in api.stats("dg").queues} == {"kept"}
