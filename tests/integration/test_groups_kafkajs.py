"""KafkaJS 2.2.4 consumers in groups against pykbroker (KafkaJS speaks JoinGroup v5, SyncGroup v3,
Heartbeat v3, LeaveGroup v3, OffsetCommit v5, OffsetFetch v4): ``KAFKAJS``, the client that
test_groups_scenarios.py runs the group scenarios with. Each member is a node process running tests/js/group_member.js, which reports its assignment,
the messages it reads and its commits as JSON lines; SIGTERM closes it cleanly (commit, LeaveGroup), SIGKILL
makes it die.

Settings beyond the defaults: sessionTimeout 4 s and heartbeatInterval 300 ms (KafkaJS heartbeats between
fetches, so its fetch wait is shortened too), subscriptions from the beginning."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from test_groups_common import TIMEOUT_S, GroupClient, MemberLog
from test_kafka_python import create_topic, produce

JS_DIR = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")

NEEDS_KAFKAJS = pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "kafkajs").is_dir(),
                                   reason="needs node and `npm install --prefix tests/js` (kafkajs 2.2.4)")


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    produce(bootstrap, topic, [{"key": v.encode(), "value": v.encode()} for v in values])


class NodeMember(MemberLog):
    """A KafkaJS group member in a node process; its reports fill this log."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, commit_each: bool = False) -> None:
        super().__init__(name)
        options = {"brokers": [bootstrap], "groupId": group, "topic": topic, "clientId": name,
                   "sessionTimeout": 4000, "heartbeatInterval": 300, "commitEach": commit_each}
        self.process = subprocess.Popen([NODE, str(JS_DIR / "group_member.js"), json.dumps(options)],
                                        stdout=subprocess.PIPE, text=True, cwd=JS_DIR)
        self._reader = threading.Thread(target=self._read_reports, daemon=True)
        self._reader.start()

    def _read_reports(self) -> None:
        for line in self.process.stdout:
            report = json.loads(line)
            if "assigned" in report:
                new = set(report["assigned"])
                self.revoked(self.partitions() - new)
                self.assigned(new)
            elif "read" in report:
                self.read(*report["read"])
            elif "committed" in report:
                for partition, offset in report["committed"]:
                    self.committed(partition, offset)
            elif "error" in report:
                self.errors.append(report["error"])

    def stop(self) -> None:
        """A clean close: KafkaJS commits and sends LeaveGroup."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            assert self.process.wait(TIMEOUT_S) == 0, f"{self.name} exited with {self.process.returncode}"
        finally:
            self.kill()
        self._reader.join(TIMEOUT_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(TIMEOUT_S)


KAFKAJS = GroupClient(create_topic=create_topic, produce_values=produce_values, member=NodeMember,
                      victim=lambda bootstrap, group, topic: NodeMember(bootstrap, group, topic, "victim"))
