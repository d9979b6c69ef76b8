"""README's "RocketMQ 5 clients" example runs as written against a fresh broker (only its address
changed), in a process of its own with the official client."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tidemark.client import Admin

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> str:
    section = README.read_text().split("## RocketMQ 5 clients", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_sends_and_receives(broker, tmp_path):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 4)
    code = example()
    assert "127.0.0.1:10911" in code
    env = {**os.environ, "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:10911", broker.address)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    sent_id, received = out.stdout.splitlines()[:2]
    assert received.split(" ")[0] == sent_id
    assert "b'{\"id\": 3}'" in received and received.endswith(" 1")
