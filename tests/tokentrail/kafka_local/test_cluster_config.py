"""The server.properties of each node of a local cluster (tokentrail.kafka_cluster), without starting one:
a static quorum of every node, its own ports and data dir, replicated topics by default."""

from __future__ import annotations

import itertools
from pathlib import Path

from tokentrail import kafka_local
from tokentrail.kafka_cluster import LocalCluster


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_every_node_votes_and_has_its_own_ports_and_data(tmp_path: Path) -> None:
    ports = itertools.count(41000)
    cluster = LocalCluster(tmp_path, tmp_path / "lib", port=lambda: next(ports))
    rendered = [_properties(kafka_local.render_server_properties(kafka_local.SERVER_TEMPLATE.read_text(),
                                                                 kafka_local.broker_overrides(node)))
                for node in cluster.nodes]
    voters = "1@127.0.0.1:41001,2@127.0.0.1:41003,3@127.0.0.1:41005"
    assert [p["node.id"] for p in rendered] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in rendered} == {voters}
    assert [p["listeners"] for p in rendered] == [
        f"PLAINTEXT://127.0.0.1:{c},CONTROLLER://127.0.0.1:{c + 1}" for c in (41000, 41002, 41004)]
    assert len({p["log.dirs"] for p in rendered}) == 3
    for p in rendered:
        assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
        assert p["offsets.topic.replication.factor"] == "3"
    assert cluster.client.bootstrap_servers == "127.0.0.1:41000,127.0.0.1:41002,127.0.0.1:41004"
    assert cluster.client.min_insync_replicas == 2
