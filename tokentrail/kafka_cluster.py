"""A local Apache Kafka cluster of N KRaft nodes (each broker + controller in one JVM, a static quorum of
all N voters), built from the pieces of ``kafka_local``: the same jars, config template and launcher.

Each node has its own free ports and data dir (``<root>/node-<id>/``, laid out as ``kafka_local``
describes). Topics default to replication factor N and ``min.insync.replicas`` N-1 (3 and 2 for the
usual three nodes), so an ``acks=all`` write survives the loss of one broker. Brokers are fenced a few
seconds after they stop heartbeating, so a killed leader is replaced quickly.

Used by the reliability rig (a partition leader's broker killed -9 mid-run); the single-broker path
(``tokentrail kafka start``) does not go through here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings

Echo = Callable[[str], None]
HOST = "127.0.0.1"


@dataclass(frozen=True)
class PartitionState:
    """Who leads one partition and which replicas are in sync (node ids)."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def _quiet(_line: str) -> None:
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class LocalCluster:
    """N local KRaft nodes on free ports; ``client`` is the KafkaSettings clients (and topics) use."""

    def __init__(self, root: Path, lib_dir: Path, *, size: int = 3, heap: str = "384m",
                 min_insync_replicas: int | None = None, partitions: int = 1,
                 port: Callable[[], int] | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        take = port or free_port
        self.root, self.size = root, size
        self.min_insync_replicas = min_insync_replicas or max(1, size - 1)
        self.cluster_id = kafka_local.new_cluster_id()
        ports = [(take(), take()) for _ in range(size)]  # (client, controller) per node
        voters = ",".join(f"{i + 1}@{HOST}:{controller}" for i, (_, controller) in enumerate(ports))
        controllers = ",".join(f"{HOST}:{controller}" for _, controller in ports)
        self.nodes: list[KafkaSettings] = [
            KafkaSettings(bootstrap_servers=f"{HOST}:{client}", controller_port=controller,
                          data_dir=root / f"node-{i + 1}", heap=heap, lib_dir=lib_dir, partitions=partitions,
                          min_insync_replicas=self.min_insync_replicas,
                          broker_properties=self._node_properties(i + 1, voters, controllers))
            for i, (client, controller) in enumerate(ports)]
        self.client = KafkaSettings(bootstrap_servers=",".join(n.bootstrap_servers for n in self.nodes),
                                    controller_port=ports[0][1], data_dir=root / "node-1", heap=heap,
                                    lib_dir=lib_dir, partitions=partitions,
                                    min_insync_replicas=self.min_insync_replicas)
        self._admin: AdminClient | None = None

    def _node_properties(self, node_id: int, voters: str, controllers: str) -> dict[str, str]:
        replicas, min_isr = str(self.size), str(self.min_insync_replicas)
        return {
            "node.id": str(node_id),
            "controller.quorum.voters": voters,  # a static quorum: every node votes
            "controller.quorum.bootstrap.servers": controllers,
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # A dead broker is fenced (and leaves every ISR) after 4 s without a heartbeat, not 9.
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
        }

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self, wait_s: float = 180.0, echo: Echo = _quiet) -> None:
        """Format every node once, launch them all (a quorum needs a majority up before any answers) and
        wait until every broker is registered and unfenced."""
        kafka_local.ensure_jars(self.nodes[0], echo)
        for node in self.nodes:
            kafka_local.format_storage(node, _quiet, cluster_id=self.cluster_id, standalone=False)
        began = time.monotonic()
        for node in self.nodes:
            if not kafka_local.status(node).running:
                kafka_local.spawn(node, _quiet)
        echo(f"cluster of {self.size} nodes launching on {self.client.bootstrap_servers}")
        self.wait_for_brokers(set(range(1, self.size + 1)), wait_s - (time.monotonic() - began), echo)
        echo(f"cluster ready after {time.monotonic() - began:.1f} s")

    def start_node(self, node_id: int, wait_s: float = 120.0, echo: Echo = _quiet) -> None:
        """Relaunch one node (its data dir kept) and wait until it is a live broker again."""
        kafka_local.spawn(self.node(node_id), _quiet)
        self.wait_for_brokers(set(range(1, self.size + 1)), wait_s, echo)

    def kill9(self, node_id: int) -> int | None:
        return kafka_local.kill9(self.node(node_id), _quiet)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Controlled shutdown of every running node, all at once: stopped one by one, the last ones
        would wait for a quorum that is gone until they are killed."""
        stoppers = [threading.Thread(target=kafka_local.stop, kwargs={"timeout_s": timeout_s, "kafka": node,
                                                                      "echo": _quiet}, daemon=True)
                    for node in self.nodes]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(timeout_s + 30)

    def node(self, node_id: int) -> KafkaSettings:
        return self.nodes[node_id - 1]

    # ------------------------------------------------------------------------------------ metadata

    def admin(self) -> AdminClient:
        """An admin client on every node; librdkafka's connection-refused lines (a node is down on
        purpose) stay out of the output."""
        if self._admin is None:
            self._admin = AdminClient({**self.client.client_config(), "log_level": 0})
        return self._admin

    def live_brokers(self, timeout_s: float = 5.0) -> set[int]:
        try:
            metadata = self.admin().list_topics(timeout=timeout_s)
        except Exception:  # KafkaException while no node answers yet
            return set()
        return set(metadata.brokers)

    def wait_for_brokers(self, wanted: set[int], timeout_s: float, echo: Echo = _quiet) -> None:
        deadline = time.monotonic() + max(timeout_s, 1.0)
        next_report = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            live = self.live_brokers(timeout_s=2.0)
            if wanted <= live:
                return
            if time.monotonic() >= next_report:
                echo(f"  waiting for brokers {sorted(wanted - live)} ... ({sorted(live)} up)")
                next_report += 10.0
            time.sleep(0.5)
        tails = "\n".join(kafka_local.log_tail(n, 10) for n in self.nodes)
        raise kafka_local.KafkaLocalError(f"brokers {sorted(wanted)} were not all up within {timeout_s:.0f} s\n{tails}")

    def partition(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> PartitionState | None:
        """The partition's leader and in-sync replicas as the cluster's metadata says now (None while no
        broker answers or the partition has no leader)."""
        try:
            metadata = self.admin().list_topics(topic, timeout=timeout_s)
        except Exception:  # no broker answers at this moment
            return None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or partition not in found.partitions:
            return None
        part = found.partitions[partition]
        if part.leader < 0:
            return None
        return PartitionState(part.leader, tuple(sorted(part.replicas)), tuple(sorted(part.isrs)))
