"""Control of one local Apache Kafka node (KRaft, broker + controller in one JVM).

The broker is the real Apache Kafka server: its jars come from Maven Central through
``deploy/kafka/pom.xml`` into ``settings.kafka.lib_dir``; Java 17+ and Maven are the only
prerequisites. Everything the node writes lives under ``settings.kafka.data_dir``:

    server.properties   effective config (deploy/kafka/server.properties + settings)
    data/               the log dirs (formatted once by kafka.tools.StorageTool)
    logs/server.log     the broker's log4j2 output
    broker.out          the JVM's stdout/stderr
    broker.pid          pid of the running broker

Start-up time is dominated by class loading on a small machine, so the first clean stop leaves a
class-data-sharing archive (JDK AppCDS) beside the jars; later starts map it and come up about
40% sooner. A JVM that finds the archive unusable ignores it and starts normally.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokentrail.errors import CliError
from tokentrail.settings import REPO_ROOT, KafkaSettings, get_settings

DEPLOY_DIR = REPO_ROOT / "deploy" / "kafka"
POM = DEPLOY_DIR / "pom.xml"
SERVER_TEMPLATE = DEPLOY_DIR / "server.properties"
LOG4J_CONFIG = DEPLOY_DIR / "log4j2.properties"
BROKER_MAIN = "kafka.Kafka"

Echo = Callable[[str], None]


class KafkaLocalError(RuntimeError):
    """The local broker could not be prepared, started or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    answering: bool
    bootstrap_servers: str

    def describe(self) -> str:
        if self.running:
            state = "answering" if self.answering else "not answering yet"
            return f"running (pid {self.pid}), {state} on {self.bootstrap_servers}"
        if self.answering:
            return f"not started here, but a broker answers on {self.bootstrap_servers}"
        return "not running"


def _echo(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- paths and config


def _paths(kafka: KafkaSettings) -> dict[str, Path]:
    root = Path(kafka.data_dir)
    return {
        "root": root,
        "props": root / "server.properties",
        "data": root / "data",
        "logs": root / "logs",
        "out": root / "broker.out",
        "pid": root / "broker.pid",
        "cds_pending": root / "broker.cds-pending",
    }


def _host_port(bootstrap_servers: str) -> tuple[str, int]:
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise KafkaLocalError(f"cannot read host:port from bootstrap servers {bootstrap_servers!r}")
    return host.strip("[]"), int(port)


CLIENT_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def broker_overrides(kafka: KafkaSettings) -> dict[str, str]:
    """The server.properties keys that tokentrail settings decide, then ``kafka.broker_properties``.

    The client listener speaks ``kafka.security_protocol`` (the listener is named after it) and carries
    inter-broker traffic too; the controller listener stays PLAINTEXT on the loopback address. What a
    secured listener needs besides (SASL mechanisms and users, key stores) comes from
    ``broker_properties``; ``plain_sasl_broker_properties`` writes the SASL/PLAIN part.
    """
    host, port = _host_port(kafka.bootstrap_servers)
    controller = f"{host}:{kafka.controller_port}"
    protocol = kafka.security_protocol.upper()
    if protocol not in CLIENT_PROTOCOLS:
        raise KafkaLocalError(f"settings.kafka.security_protocol {kafka.security_protocol!r} is not one of "
                              f"{', '.join(CLIENT_PROTOCOLS)}")
    listeners = f"{protocol}://{host}:{port},CONTROLLER://{controller}"
    overrides = {
        "listeners": listeners,
        "advertised.listeners": listeners,
        "controller.quorum.bootstrap.servers": controller,
        "log.dirs": str(_paths(kafka)["data"]),
        "message.max.bytes": str(kafka.max_message_bytes),
        "replica.fetch.max.bytes": str(kafka.max_message_bytes),
    }
    if protocol != "PLAINTEXT":
        overrides["listener.security.protocol.map"] = f"CONTROLLER:PLAINTEXT,{protocol}:{protocol}"
        overrides["inter.broker.listener.name"] = protocol
    return {**overrides, **kafka.broker_properties}


def plain_sasl_broker_properties(users: dict[str, str], broker_user: str,
                                 listener: str = "SASL_PLAINTEXT") -> dict[str, str]:
    """broker_properties for a SASL/PLAIN client listener: ``users`` (name -> password) may log in, and
    the broker talks to itself as ``broker_user`` (one of them). PLAIN keeps passwords in the file:
    for local and test brokers."""
    if broker_user not in users:
        raise KafkaLocalError(f"the broker's own user {broker_user!r} must be one of the users")

    def quoted(value: str) -> str:
        if '"' in value or "\\" in value:
            raise KafkaLocalError("SASL/PLAIN user names and passwords may not contain quotes or backslashes")
        return f'"{value}"'

    entries = [f"username={quoted(broker_user)}", f"password={quoted(users[broker_user])}"]
    entries += [f"user_{name}={quoted(password)}" for name, password in users.items()]
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required " + " ".join(entries) + ";"
    return {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        f"listener.name.{listener.lower()}.plain.sasl.jaas.config": jaas,
    }


def render_server_properties(template: str, overrides: dict[str, str]) -> str:
    """Replace (or append) ``key=value`` lines of a properties file, keeping comments and order."""
    remaining = dict(overrides)
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip()
        if not line.lstrip().startswith("#") and "=" in line and key in remaining:
            lines.append(f"{key}={remaining.pop(key)}")
        else:
            lines.append(line)
    lines.extend(f"{key}={value}" for key, value in remaining.items())
    return "\n".join(lines) + "\n"


def _write_effective_config(kafka: KafkaSettings) -> Path:
    paths = _paths(kafka)
    paths["root"].mkdir(parents=True, exist_ok=True)
    text = render_server_properties(SERVER_TEMPLATE.read_text(), broker_overrides(kafka))
    paths["props"].write_text(text)
    return paths["props"]


# ---------------------------------------------------------------- jars and java


def _has_jars(lib_dir: Path) -> bool:
    return lib_dir.is_dir() and any(lib_dir.glob("kafka_2.13-*.jar"))


def duplicate_artifacts(lib_dir: Path) -> dict[str, list[str]]:
    """Artifacts present in more than one version (left by a fetch after a version change)."""
    versions: dict[str, list[str]] = {}
    for jar in sorted(lib_dir.glob("*.jar")):
        match = re.match(r"^(.+?)-(\d.*)\.jar$", jar.name)
        if match:
            versions.setdefault(match.group(1), []).append(match.group(2))
    return {artifact: found for artifact, found in versions.items() if len(found) > 1}


def ensure_jars(kafka: KafkaSettings | None = None, echo: Echo = _echo) -> Path:
    """Fetch the broker's jars from Maven Central once; later calls find them cached."""
    kafka = kafka or get_settings().kafka
    lib_dir = Path(kafka.lib_dir)
    if _has_jars(lib_dir):
        duplicates = duplicate_artifacts(lib_dir)
        if duplicates:
            listed = ", ".join(f"{name} {' and '.join(found)}" for name, found in duplicates.items())
            raise KafkaLocalError(
                f"{lib_dir} holds two versions of {listed}; delete the folder and start again to refetch"
            )
        return lib_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError("Maven (mvn) is needed once to fetch the Kafka jars (apt install maven)")
    echo(f"fetching Apache Kafka jars from Maven Central into {lib_dir} ...")
    cmd = [mvn, "-B", "-f", str(POM), f"-Dkafka.lib.dir={lib_dir}", "dependency:copy-dependencies"]
    # Maven's own output is the progress: a line per artifact downloaded and copied.
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0 or not _has_jars(lib_dir):
        raise KafkaLocalError(f"fetching the Kafka jars failed (exit {result.returncode}): {' '.join(cmd)}")
    echo(f"fetched {sum(1 for _ in lib_dir.glob('*.jar'))} jars")
    return lib_dir


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaLocalError("the Kafka broker needs Java 17 or newer (apt install openjdk-17-jre-headless)")
    return java


def _jvm_command(kafka: KafkaSettings, main_class: str, *args: str, heap: str | None = None) -> list[str]:
    logs = _paths(kafka)["logs"]
    jvm = [_java()]
    if heap:
        jvm += [f"-Xmx{heap}", f"-Xms{heap}"]
    jvm += [
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Xshare:auto",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        str(Path(kafka.lib_dir) / "*"),
        main_class,
        *args,
    ]
    return jvm


# ---------------------------------------------------------------- class-data-sharing archive


def cds_archive(kafka: KafkaSettings) -> Path:
    """Where the broker's AppCDS archive lives; the name changes with the JVM or the jar set."""
    java = Path(_java()).resolve()
    lib_dir = Path(kafka.lib_dir)
    jars = sorted((jar.name, jar.stat().st_size) for jar in lib_dir.glob("*.jar"))
    identity = repr((str(java), java.stat().st_mtime_ns, jars)).encode()
    return lib_dir / ".cds" / f"kafka-broker-{hashlib.sha256(identity).hexdigest()[:16]}.jsa"


def _cds_flags(kafka: KafkaSettings) -> list[str]:
    """Use the archive when there is one; otherwise have this run write one at its exit."""
    archive = cds_archive(kafka)
    pending_marker = _paths(kafka)["cds_pending"]
    _discard_pending_cds(kafka)
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}"]
    archive.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: brokers on other data dirs may be dumping at the same time.
    pending = archive.with_name(f"{archive.stem}.{uuid.uuid4().hex[:8]}.tmp")
    pending_marker.write_text(f"{pending}\n")
    return [f"-XX:ArchiveClassesAtExit={pending}"]


def _promote_pending_cds(kafka: KafkaSettings) -> None:
    """After a clean exit the dumped archive is complete: move it into place atomically."""
    marker = _paths(kafka)["cds_pending"]
    if not marker.exists():
        return
    pending = Path(marker.read_text().strip())
    if pending.exists() and pending.stat().st_size > 0:
        os.replace(pending, cds_archive(kafka))
    marker.unlink(missing_ok=True)


def _discard_pending_cds(kafka: KafkaSettings) -> None:
    """A dump left by a broker that did not stop cleanly may be partial: never use it."""
    marker = _paths(kafka)["cds_pending"]
    if marker.exists():
        Path(marker.read_text().strip()).unlink(missing_ok=True)
        marker.unlink(missing_ok=True)


# ---------------------------------------------------------------- storage


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding, as Kafka writes it."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # Kafka avoids ids that read like a command-line flag
            return cid


def is_formatted(kafka: KafkaSettings) -> bool:
    return (_paths(kafka)["data"] / "meta.properties").exists()


def format_storage(kafka: KafkaSettings, echo: Echo = _echo, *, cluster_id: str | None = None,
                   standalone: bool = True) -> None:
    """Format the log dir as a standalone KRaft node; a formatted dir is left as it is.

    ``standalone=False`` formats one node of a static quorum (``controller.quorum.voters`` in
    ``kafka.broker_properties``); every node of that cluster must get the same ``cluster_id``."""
    if is_formatted(kafka):
        return
    paths = _paths(kafka)
    props = _write_effective_config(kafka)
    paths["logs"].mkdir(parents=True, exist_ok=True)
    echo(f"formatting Kafka storage in {paths['data']} ...")
    mode = ["--standalone"] if standalone else []
    cmd = _jvm_command(
        kafka, "kafka.tools.StorageTool",
        "format", *mode, "--ignore-formatted", "-t", cluster_id or new_cluster_id(), "-c", str(props),
        heap="256m",
    )
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not is_formatted(kafka):
        raise KafkaLocalError(f"formatting Kafka storage failed:\n{result.stdout}{result.stderr}")


# ---------------------------------------------------------------- process state


def _read_pid(kafka: KafkaSettings) -> int | None:
    try:
        return int(_paths(kafka)["pid"].read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _is_our_broker(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) kafka.Kafka JVM; guards against reused pids."""
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and BROKER_MAIN.encode() in cmdline


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def broker_answers(kafka: KafkaSettings, timeout: float = 3.0) -> bool:
    """True when the broker at ``kafka.bootstrap_servers`` returns cluster metadata naming a broker.

    Asked with ``kafka.client_config()``, so a secured listener answers only to the right credentials."""
    host, port = _host_port(kafka.bootstrap_servers)
    if not _port_open(host, port):
        return False  # skip the admin client: it would log connection-refused noise
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(kafka.client_config()).list_topics(timeout=timeout)
    except Exception:  # KafkaException while the node is still starting
        return False
    return bool(metadata.brokers)


def status(kafka: KafkaSettings | None = None) -> BrokerStatus:
    kafka = kafka or get_settings().kafka
    pid = _read_pid(kafka)
    running = pid is not None and _is_our_broker(pid)
    return BrokerStatus(
        running=running,
        pid=pid if running else None,
        answering=broker_answers(kafka, timeout=2.0),
        bootstrap_servers=kafka.bootstrap_servers,
    )


def log_tail(kafka: KafkaSettings, lines: int = 25) -> str:
    """The last lines of the node's JVM output and server log (for an error message)."""
    return _log_tail(kafka, lines)


def _log_tail(kafka: KafkaSettings, lines: int = 25) -> str:
    paths = _paths(kafka)
    chunks = []
    for path in (paths["out"], paths["logs"] / "server.log"):
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"--- {path} ---\n" + "\n".join(tail))
    return "\n".join(chunks)


# ---------------------------------------------------------------- start / stop


def start(wait_s: float = 60.0, kafka: KafkaSettings | None = None, echo: Echo = _echo) -> BrokerStatus:
    """Start the local broker detached and wait until it answers; a running broker is left alone."""
    kafka = kafka or get_settings().kafka
    current = status(kafka)
    if current.running:
        echo(f"Kafka already {current.describe()}")
        if not current.answering:
            return _wait_until_answering(kafka, current.pid, wait_s, time.monotonic(), echo)
        return current
    if current.answering:
        echo(f"a Kafka broker not started by tokentrail answers on {kafka.bootstrap_servers}; using it")
        return current
    host, port = _host_port(kafka.bootstrap_servers)
    for busy in (port, kafka.controller_port):
        if _port_open(host, busy):
            raise KafkaLocalError(f"port {host}:{busy} is taken by something that is not a Kafka broker")

    ensure_jars(kafka, echo)
    began = time.monotonic()
    format_storage(kafka, echo)
    pid = spawn(kafka, echo)
    return _wait_until_answering(kafka, pid, wait_s, began, echo)


def spawn(kafka: KafkaSettings, echo: Echo = _echo) -> int:
    """Launch the (formatted) node detached, write its pid file and return the pid, without waiting for
    it to answer (a node of a quorum answers only once enough voters are up)."""
    props = _write_effective_config(kafka)
    paths = _paths(kafka)
    paths["logs"].mkdir(parents=True, exist_ok=True)
    cmd = _jvm_command(kafka, BROKER_MAIN, str(props), heap=kafka.heap)
    cmd[1:1] = _cds_flags(kafka)
    with open(paths["out"], "ab") as out:
        # A session of its own: the broker outlives this command and ignores the terminal's Ctrl-C.
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=paths["root"],
        )
    # Until the child has exec'd java its /proc cmdline is empty, and _is_our_broker would call it gone.
    exec_deadline = time.monotonic() + 10.0
    while proc.poll() is None and time.monotonic() < exec_deadline:
        try:
            if BROKER_MAIN.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0"):
                break
        except OSError:
            pass
        time.sleep(0.005)
    paths["pid"].write_text(f"{proc.pid}\n")
    echo(f"starting Kafka (pid {proc.pid}, heap {kafka.heap}) on {kafka.bootstrap_servers}; "
         f"logs in {paths['logs']}")
    return proc.pid


def _wait_until_answering(
    kafka: KafkaSettings, pid: int | None, wait_s: float, began: float, echo: Echo
) -> BrokerStatus:
    deadline = began + wait_s
    next_report = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if pid is not None and not _is_our_broker(pid):
            _paths(kafka)["pid"].unlink(missing_ok=True)
            raise KafkaLocalError(f"the Kafka broker exited during start\n{_log_tail(kafka)}")
        if broker_answers(kafka, timeout=1.0):
            echo(f"Kafka ready on {kafka.bootstrap_servers} after {time.monotonic() - began:.1f} s")
            return BrokerStatus(True, pid, True, kafka.bootstrap_servers)
        if time.monotonic() >= next_report:
            echo(f"  waiting for Kafka ... {time.monotonic() - began:.0f} s")
            next_report += 5.0
        time.sleep(0.2)
    secured = "" if kafka.security_protocol.upper() == "PLAINTEXT" else (
        f"; asked over {kafka.security_protocol} with settings.kafka.extra_client_config: check the credentials")
    raise KafkaLocalError(
        f"Kafka did not answer on {kafka.bootstrap_servers} within {wait_s:.0f} s "
        f"(pid {pid} left running; `tokentrail kafka stop` ends it){secured}\n{_log_tail(kafka)}"
    )


def stop(timeout_s: float = 60.0, kafka: KafkaSettings | None = None, echo: Echo = _echo) -> bool:
    """SIGTERM the broker, wait for its controlled shutdown, SIGKILL after ``timeout_s``.

    Returns True when a broker was stopped, False when none was running.
    """
    kafka = kafka or get_settings().kafka
    pid = _read_pid(kafka)
    pid_file = _paths(kafka)["pid"]
    if pid is None or not _is_our_broker(pid):
        pid_file.unlink(missing_ok=True)
        echo("Kafka is not running")
        return False
    dumping = _paths(kafka)["cds_pending"].exists()
    echo(f"stopping Kafka (pid {pid}){' and saving its class-data archive' if dumping else ''} ...")
    began = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    clean = True
    while _is_our_broker(pid):
        if time.monotonic() - began > timeout_s:
            echo(f"Kafka did not stop within {timeout_s:.0f} s; killing it")
            os.kill(pid, signal.SIGKILL)
            clean = False
            while _is_our_broker(pid):
                time.sleep(0.1)
            break
        time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
    if clean:
        _promote_pending_cds(kafka)
    else:
        _discard_pending_cds(kafka)
    echo(f"Kafka stopped after {time.monotonic() - began:.1f} s")
    return True


def kill9(kafka: KafkaSettings, echo: Echo = _echo) -> int | None:
    """SIGKILL the node (a crash: no controlled shutdown, no flush); the pid killed, None if none ran."""
    pid = _read_pid(kafka)
    if pid is None or not _is_our_broker(pid):
        return None
    os.kill(pid, signal.SIGKILL)
    while _is_our_broker(pid):
        time.sleep(0.05)
    _paths(kafka)["pid"].unlink(missing_ok=True)
    _discard_pending_cds(kafka)
    echo(f"Kafka (pid {pid}) killed -9")
    return pid


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kafka",
        help="start, stop or inspect the local Apache Kafka broker (KRaft, one node)",
        description="Control the local single-node Apache Kafka broker (jars from Maven Central, "
        "data under settings.kafka.data_dir).",
    )
    actions = parser.add_subparsers(dest="kafka_action", metavar="ACTION", required=True)

    p_start = actions.add_parser("start", help="start the broker (no-op if it is already running)",
                                 description="Fetch jars if needed, format storage once, start the "
                                 "broker detached and wait until it answers.")
    p_start.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                         help="how long to wait for the broker to answer (default: 60)")
    p_start.set_defaults(func=_cmd_start)

    p_stop = actions.add_parser("stop", help="stop the broker (controlled shutdown)",
                                description="Send SIGTERM, wait for a clean shutdown, "
                                "SIGKILL after --timeout.")
    p_stop.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="seconds before the broker is killed (default: 60)")
    p_stop.set_defaults(func=_cmd_stop)

    p_status = actions.add_parser("status", help="say whether the broker runs and answers",
                                  description="Print running/not running, the pid, and whether the "
                                  "bootstrap address answers. Exit 0 when it answers, 1 otherwise.")
    p_status.set_defaults(func=_cmd_status)


def _as_cli_error(exc: KafkaLocalError) -> Exception:
    return CliError(str(exc))


def _cmd_start(args: argparse.Namespace) -> int:
    try:
        start(wait_s=args.wait)
    except KafkaLocalError as exc:
        raise _as_cli_error(exc) from exc
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    try:
        stop(timeout_s=args.timeout)
    except KafkaLocalError as exc:
        raise _as_cli_error(exc) from exc
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    current = status()
    print(f"kafka: {current.describe()}")
    return 0 if current.answering else 1
