"""The `tidemark` command as an operator meets it, against real broker processes: help on every option,
consume's readable and JSON output and how bodies are shown, send from a file or stdin, one-line errors
for an empty --broker, a down broker in a list and a taken port, and a DLQ requeue that never sends a
message twice."""

from __future__ import annotations

import argparse
import base64
import json
import os
import pty
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess, free_port
from workload import create_topic, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tidemark.client.cli import broker_cmds
from tidemark.client.cli.main import build_parser, client_options
from tidemark.client.cli.output import escaped_text, render_body
from tidemark.client.dead_letters import advanced, requeue_start
from tidemark.client.errors import NotFoundError
from tidemark.common.protocol import dlq_topic

REPO = Path(__file__).resolve().parents[2]
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"


def tidemark(*args: str, broker: str | None, stdin: bytes | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tidemark.client.cli.main", *args]
    if broker is not None:
        cmd += ["--broker", broker]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    out = forkserver.run(cmd, input=stdin, capture_output=True, timeout=timeout, cwd=REPO, env=env)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode("utf-8", "replace"),
                                       out.stderr.decode("utf-8", "replace"))


def ok(*args: str, broker: str, stdin: bytes | None = None) -> str:
    proc = tidemark(*args, broker=broker, stdin=stdin)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def one_line_error(code: int, *args: str, broker: str | None, stdin: bytes | None = None) -> str:
    """Run a command that must fail with `code` and one line on stderr (usage errors: argparse's usage
    lines, then one error line); return that line."""
    proc = tidemark(*args, broker=broker, stdin=stdin)
    assert proc.returncode == code, f"{args}: exit {proc.returncode}, wanted {code}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- help on every option -----------------------------------------------------------------------


def options_without_help(parser: argparse.ArgumentParser, path: str):
    """`path option` for every argument of the parser and its subcommands that has no help text (a
    SUPPRESSed one is hidden on purpose)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options_without_help(sub, f"{path} {name}")
        elif isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        elif not (action.help or "").strip():
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def _broker_client_parsers():
    """`tidemark broker promote` (and its siblings): main() routes them to broker_cmds before the
    daemon's parser."""
    yield "tidemark broker promote", broker_cmds.build_parser(client_options())
    try:
        yield "tidemark broker status", broker_cmds.build_parser(client_options(), "status")
    except TypeError:
        pass  # no such command here


def test_the_help_walk_names_an_option_without_help():
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers()
    p = sub.add_parser("cmd")
    p.add_argument("--told", help="has some")
    p.add_argument("--bare")
    p.add_argument("thing")
    assert list(options_without_help(parser, "x")) == ["x cmd --bare", "x cmd thing"]


def test_every_option_of_every_command_has_help():
    missing = list(options_without_help(build_parser(), "tidemark"))
    for path, parser in _broker_client_parsers():
        missing.extend(options_without_help(parser, path))
    assert not missing, "options without help text:\n" + "\n".join(missing)


# -- how bodies are shown, and the requeue mark (pure) ---------------------------------------------------


@pytest.mark.parametrize("data, shown", [
    (b"plain", "plain"),
    (b"a\\b", "a\\\\b"),  # a backslash is doubled: an escape is never ambiguous
    (b"tab\tnew\nline\r", "tab\\tnew\\nline\\r"),
    (b"\x00\x1b[31m\x7f", "\\x00\\x1b[31m\\x7f"),
    ("héllo".encode(), "héllo"),
    (b"\xffok\xc3", "\\xffok\\xc3"),  # undecodable bytes, also a character cut at the end
    (b"", ""),
])
def test_escaped_text_is_one_unambiguous_line(data, shown):
    assert escaped_text(data) == shown


def test_render_body_cuts_whole_characters_and_says_how_much():
    assert render_body(b"abcdef", None, 4) == ("abcd", "utf-8", 2)
    assert render_body("ééé".encode(), "text", 3) == ("é", "text", 4)  # not half of the second é
    assert render_body(b"\xff\xfe\xfd", None, 2) == ("//4=", "base64", 1)  # binary: cut at the byte
    assert render_body(b"\x01\x02", "hex", 0) == ("0102", "hex", 0)
    assert render_body(b"abc", "base64", 10) == ("YWJj", "base64", 0)


def test_the_requeue_mark_moves_over_a_contiguous_prefix_only():
    assert requeue_start(low=0, mark=-1) == 0  # never requeued
    assert requeue_start(low=5, mark=2) == 5  # older dead letters deleted
    assert requeue_start(low=0, mark=3) == 3
    assert advanced(3, 3) == 4
    assert advanced(3, 7) == 3  # one message requeued by id past the mark: those before it still wait


# -- consume: readable lines or JSON lines ---------------------------------------------------------


@pytest.fixture(scope="module")
def surface_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("cli-surface") / "data").start()
    yield b
    b.kill()


BODIES = [b"hello", b"two\nlines\tand a tab", b"\xff\xfebin\x1b", "é".encode() * 500]


@pytest.fixture(scope="module")
def shown_topic(surface_broker) -> str:
    create_topic(surface_broker.address, "Shown", 1)
    with Producer(brokers=surface_broker.address) as p:
        for i, body in enumerate(BODIES):
            p.send(Message("Shown", body, tags="t" if i == 0 else "", keys=f"k{i}"),
                   queue=MessageQueue("Shown", "broker-a", 0))
    return "Shown"


def _on_a_terminal(*args: str, broker: str) -> list[str]:
    """stdout lines of a command whose stdout is a terminal (a pseudo-terminal)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    proc = subprocess.Popen([sys.executable, "-m", "tidemark.client.cli.main", *args, "--broker", broker], stdout=slave,
                            stderr=subprocess.PIPE, cwd=REPO, env=env)
    os.close(slave)
    chunks = []
    try:
        while data := os.read(master, 65536):
            chunks.append(data)
    except OSError:  # EIO: the command exited and closed the terminal
        pass
    finally:
        os.close(master)
    assert proc.wait(60) == 0, proc.stderr.read()
    proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n").splitlines()


def _readable(addr: str, *extra: str) -> list[str]:
    return ok("consume", "Shown", "--from-offset", "earliest", "--count", "4", "--readable", *extra,
              broker=addr).splitlines()


def test_consume_prints_json_lines_into_a_pipe_and_readable_lines_on_request(surface_broker, shown_topic):
    addr = surface_broker.address
    # stdout is a pipe here: JSON lines, as scripts (and --json) expect, bodies whole.
    docs = [json.loads(line) for line in ok("consume", "Shown", "--from-offset", "earliest", "--count", "4",
                                             broker=addr).splitlines()]
    assert [d["body_encoding"] for d in docs] == ["utf-8", "utf-8", "base64", "utf-8"]
    assert base64.b64decode(docs[2]["body"]) == BODIES[2] and docs[3]["body"] == "é" * 500
    assert not any("body_cut_bytes" in d for d in docs)

    lines = _readable(addr)
    assert _on_a_terminal("consume", "Shown", "--from-offset", "earliest", "--count", "4", broker=addr) == lines
    assert len(lines) == 4
    assert re.fullmatch(rf"Shown  broker-a/0@0  {STAMP}  tags=t keys=k0  hello", lines[0]), lines[0]
    assert lines[1].endswith("  keys=k1  two\\nlines\\tand a tab"), lines[1]
    assert lines[2].endswith("  keys=k2  \\xff\\xfebin\\x1b"), lines[2]
    # 256 bytes shown by default: 128 two-byte characters, and the rest said.
    assert lines[3].endswith("  keys=k3  " + "é" * 128 + "... [744 bytes cut]"), lines[3]


def test_consume_body_options(surface_broker, shown_topic):
    addr = surface_broker.address
    assert _readable(addr, "--max-body-bytes", "0")[3].endswith("  " + "é" * 500)
    assert _readable(addr, "--max-body-bytes", "3")[3].endswith("  é... [998 bytes cut]")  # never half a character
    assert _readable(addr, "--body-format", "hex")[0].endswith("  68656c6c6f")
    assert _readable(addr, "--body-format", "base64")[2].endswith("  //5iaW4b")

    docs = [json.loads(line) for line in ok("consume", "Shown", "--from-offset", "earliest", "--count", "4",
                                             "--json", "--max-body-bytes", "4", "--body-format", "base64",
                                             broker=addr).splitlines()]
    assert [(d["body"], d["body_encoding"], d.get("body_cut_bytes", 0)) for d in docs] == [
        ("aGVsbA==", "base64", 1), ("dHdvCg==", "base64", 15), ("//5iaQ==", "base64", 2),
        ("w6nDqQ==", "base64", 996)]
    text = json.loads(ok("consume", "Shown", "--from-offset", "2", "--count", "1", "--json", "--body-format", "text",
                         broker=addr))
    assert (text["body"], text["body_encoding"]) == ("\\xff\\xfebin\\x1b", "text")

    assert "--readable" in one_line_error(1, "consume", "Shown", "--count", "1", "--json", "--readable", broker=addr)
    assert "--body-format" in one_line_error(2, "consume", "Shown", "--body-format", "rot13", broker=addr)


def test_consume_with_a_group_prints_readable_lines_too(surface_broker, shown_topic):
    lines = ok("consume", "Shown", "--group", "reader", "--from-where", "first", "--count", "4", "--readable",
               broker=surface_broker.address).splitlines()
    assert [line.split("  ")[1] for line in lines] == [f"broker-a/0@{i}" for i in range(4)]
    assert lines[0].endswith("  hello")


# -- send: --body-file, --body - (stdin), --lines -------------------------------------------------------


def _bodies(addr: str, topic: str) -> list[bytes]:
    with Admin(brokers=addr) as admin:
        return [m.body for m in admin.pull(MessageQueue(topic, "broker-a", 0), 0, max_nums=64).messages]


def test_send_from_a_file_or_stdin_whole_or_a_message_per_line(surface_broker, tmp_path):
    addr = surface_broker.address
    create_topic(addr, "Fed", 1)
    binary = tmp_path / "body.bin"
    binary.write_bytes(b"\x00\x01bin\nary\xff")
    rows = ok("send", "Fed", "--body-file", str(binary), "--json", broker=addr)
    assert [r["offset"] for r in json.loads(rows)] == [0]
    ok("send", "Fed", "--body", "-", broker=addr, stdin=b"whole\ninput\n")
    sent = json.loads(ok("send", "Fed", "--body", "-", "--lines", "--json", broker=addr,
                         stdin=b"one\n\n  \ntwo\r\nthree"))
    assert [r["offset"] for r in sent] == [2, 3, 4]
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"a\nb\nc\n")
    batched = json.loads(ok("send", "Fed", "--body-file", str(lines), "--lines", "--batch", "2", "--json",
                            broker=addr))
    assert [r["offset"] for r in batched] == [5, 6, 7]
    assert _bodies(addr, "Fed") == [b"\x00\x01bin\nary\xff", b"whole\ninput\n", b"one", b"two", b"three",
                                    b"a", b"b", b"c"]

    missing = tmp_path / "nope.txt"
    assert str(missing) in one_line_error(1, "send", "Fed", "--body-file", str(missing), broker=addr)
    assert "--lines" in one_line_error(1, "send", "Fed", "--body", "-", "--lines", broker=addr, stdin=b"\n \n")
    assert "--lines" in one_line_error(1, "send", "Fed", "--count", "2", "--lines", broker=addr)
    one_line_error(2, "send", "Fed", "--body", "x", "--body-file", str(binary), broker=addr)
    assert len(_bodies(addr, "Fed")) == 8, "a failed send sent something"


# -- addresses and ports ------------------------------------------------------------------------------


def test_an_empty_broker_list_is_a_usage_error():
    for value in ("", " ", ","):
        line = one_line_error(2, "topic", "list", broker=value)
        assert "broker address" in line and "error" in line, line
    assert "name server address" in one_line_error(2, "topic", "list", "--namesrv", "", broker=None)


def test_a_down_broker_in_the_list_is_named_once_and_the_others_serve(surface_broker):
    addr, dead = surface_broker.address, f"127.0.0.1:{free_port()}"
    create_topic(addr, "Listed", 1)
    for args in (("topic", "list"), ("send", "Listed", "--body", "x"),
                 ("consume", "Listed", "--from-offset", "earliest", "--count", "1")):
        proc = tidemark(*args, broker=f"{dead},{addr}")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip(), f"{args}: nothing printed"
        warnings = proc.stderr.strip().splitlines()
        assert len(warnings) == 1 and dead in warnings[0] and warnings[0].startswith("warning:"), proc.stderr
    assert "Listed" in tidemark("topic", "list", broker=f"{dead},{addr}").stdout
    # Every broker down: the error, not a warning.
    line = one_line_error(1, "topic", "list", broker=dead)
    assert dead in line and not line.startswith("warning")


def _run_broker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "broker", "--host", "127.0.0.1",
                           "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_taken_port_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, what in ((("--port", str(port)), "port"),
                           (("--port", "0", "--metrics-port", str(port)), "metrics port")):
            proc = _run_broker(tmp_path, *args)
            assert proc.returncode == 1, proc.stderr
            assert "Traceback" not in proc.stderr and "add_port" not in proc.stderr, proc.stderr
            # Checked before anything starts: the one line, and no data dir made.
            assert proc.stderr.splitlines() == [f"tidemark broker: {what} {port} on 127.0.0.1 is already in use"], \
                proc.stderr
            assert not (tmp_path / "data").exists()
    # The same port for gRPC and metrics: the second bind is refused, said the same way.
    both = free_port()
    proc = _run_broker(tmp_path, "--port", str(both), "--metrics-port", str(both))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"tidemark broker: metrics port {both} on 127.0.0.1 is already in use" in proc.stderr.splitlines()


# -- dlq requeue: once ---------------------------------------------------------------------------------


def _dead(addr: str, group: str) -> list:
    with Admin(brokers=addr) as admin:
        try:
            return admin.dead_letters(group)
        except NotFoundError:
            return []


def _requeue(addr: str, group: str, *which: str) -> list[dict]:
    return json.loads(ok("dlq", "requeue", group, *which, "--execute", "--json", broker=addr))


def test_dlq_requeue_all_sends_each_dead_letter_once(broker_factory):
    broker = broker_factory(args=("--delay-levels", "100ms 200ms 300ms", "--max-reconsume-times", "1"))
    addr = broker.address
    create_topic(addr, "Jobs", 1)
    poison = {b"m0", b"m1", b"m2", b"late"}
    accepted: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            if any(m.body in poison for m in msgs):
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            accepted.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group="doomed", brokers=addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("Jobs")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        with Producer(brokers=addr) as p:
            ids = [p.send(Message("Jobs", b"m%d" % i)).msg_id for i in range(3)]
        wait_until(lambda: len(_dead(addr, "doomed")) == 3, 60, "three dead letters")
        with lock:
            poison.difference_update({b"m0", b"m1", b"m2"})  # fixed: the requeued copies are taken now

        assert sorted(r["msg_id"] for r in _requeue(addr, "doomed", "--all")) == sorted(ids)
        wait_until(lambda: sorted(accepted) == [b"m0", b"m1", b"m2"], 60, "the requeued copies consumed")
        again = ok("dlq", "requeue", "doomed", "--all", "--execute", broker=addr)
        assert again.splitlines()[-1] == "0 message(s) requeued", again
        with Admin(brokers=addr) as admin:
            assert admin.max_offset(MessageQueue("Jobs", "broker-a", 0)) == 6, "a dead letter was sent twice"
            dlq = MessageQueue(dlq_topic("doomed"), "broker-a", 0)
            assert admin.committed("doomed", dlq) == 3  # the mark: `group progress` shows what waits

        # A new dead letter: only it is requeued.
        with Producer(brokers=addr) as p:
            late = p.send(Message("Jobs", b"late")).msg_id
        wait_until(lambda: len(_dead(addr, "doomed")) == 4, 60, "the fourth dead letter")
        consumer.shutdown()
        assert [r["msg_id"] for r in _requeue(addr, "doomed", "--all")] == [late]
        assert _requeue(addr, "doomed", "--all") == []
        # One message by id is requeued when asked, even again; moving the mark back makes all eligible.
        assert [r["msg_id"] for r in _requeue(addr, "doomed", "--msg-id", ids[1])] == [ids[1]]
        ok("group", "reset-offset", "doomed", "--topic", dlq_topic("doomed"), "--to-earliest", "--execute", broker=addr)
        assert sorted(r["msg_id"] for r in _requeue(addr, "doomed", "--all")) == sorted([*ids, late])
        assert _requeue(addr, "doomed", "--all") == []
    finally:
        consumer.shutdown()
