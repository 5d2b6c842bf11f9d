"""A real Kafka broker (KRaft, one node acting as broker and controller) run with plain java on 127.0.0.1.

The jars are the ``kafka-broker`` set of ``scripts/maven`` (``harness.jars``). ``start()`` formats a
fresh log dir with Kafka's own ``kafka.tools.StorageTool`` (a KRaft node refuses an unformatted one),
then runs ``kafka.Kafka`` on two free loopback ports: one for clients (``bootstrap``), one for the
controller quorum. Ready means a client's metadata request lists this broker. The log dir survives
``stop()``/``kill()``, so ``start()`` brings back the same topics at the same offsets.

Topics are fed and read with confluent-kafka (librdkafka): ``produce`` (an idempotent producer, every
record acknowledged before it returns), ``end_offsets`` (the broker's end offset per partition, what a
reader's ``latest`` means), ``add_partitions``; ``json_topic`` is Spark's Kafka source over such a topic.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

from harness.jars import class_path
from harness.ports import LOOPBACK, free_port, is_port_free
from harness.process import (
    HarnessError,
    ManagedProcess,
    PortInUseError,
    ServerProcess,
    ServerStartError,
    log_tail,
)

JAR_SET = "kafka-broker"
#: librdkafka logs every refused connection (each probe while the broker starts) to stderr; only its
#: critical messages are worth a line there, errors reach the caller as exceptions anyway.
_CLIENT_LOG_LEVEL = 2
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d{HH:mm:ss.SSS}] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


#: What a broker answers for a partition it does not serve yet (created or grown a moment ago).
_NOT_SERVED_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


def json_topic(spark: Any, bootstrap: str, topic: str, schema: Any, *, max_offsets_per_trigger: int) -> Any:
    """A streaming DataFrame of ``topic``'s JSON values (the columns of ``schema``) through Spark's Kafka
    source, from the earliest offsets when the checkpoint is new, at most ``max_offsets_per_trigger``
    records a batch (Spark splits them over the partitions in proportion to what each has)."""
    from pyspark.sql.functions import col, from_json

    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets_per_trigger)
        .load()
        .select(from_json(col("value").cast("string"), schema).alias("r"))
        .select("r.*")
    )


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (Kafka's ``Uuid``)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaBroker(ServerProcess):
    """One KRaft node in ``workdir`` (server.properties, log4j2.properties, data/, kafka.log)."""

    stop_timeout_s = 30.0

    def __init__(self, workdir: Path, *, heap_mb: int = 384, start_timeout_s: float = 120.0) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.config_path = self.workdir / "server.properties"
        self.log_path = self.workdir / "kafka.log"
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self._port: int | None = None
        self._controller_port: int | None = None
        self._proc: ManagedProcess | None = None
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        #: Seconds from spawning java to a served metadata request, latest start (the format excluded).
        self.last_start_s: float | None = None
        #: Seconds the log dir format took (first start only).
        self.format_s: float | None = None

    # -- addresses ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise HarnessError("KafkaBroker has no port before its first start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for ``kafka.bootstrap.servers`` and ``bootstrap.servers``."""
        return f"{LOOPBACK}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> KafkaBroker:
        """Start (or restart on the same ports and log dir) and wait until it serves clients."""
        if self.running:
            raise HarnessError(f"Kafka on {self.bootstrap} is already running")
        self._reap_dead()
        first = self._port is None
        attempts = 3 if first else 1  # clients know the address after the first start
        for attempt in range(1, attempts + 1):
            if first:
                self._port, self._controller_port = free_port(), free_port()
            try:
                self._start_once(format_dir=first)
                return self
            except PortInUseError:
                if attempt == attempts:
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)
        raise AssertionError("unreachable")

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise HarnessError("java not found on PATH; run scripts/install-test-deps (it installs a JRE)")
        return [
            java,
            "-Xms64m",
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",  # one GC thread, not one per core competing with the tests
            "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            class_path(JAR_SET),
        ]

    def _start_once(self, *, format_dir: bool) -> None:
        for port in (self.port, self._controller_port):
            assert port is not None
            if not is_port_free(port):
                raise PortInUseError(f"Kafka port {port} is taken by another process")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        self.config_path.write_text(self._config())
        if format_dir:
            t0 = time.monotonic()
            self._format()
            self.format_s = time.monotonic() - t0
        t0 = time.monotonic()
        self._proc = ManagedProcess(
            [*self._java(), "kafka.Kafka", str(self.config_path)],
            log_path=self.log_path,
            cwd=self.workdir,
            name=f"kafka:{self.port}",
        )
        try:
            self._wait_ready()
        except BaseException:
            self._proc.kill()
            self._proc = None
            raise
        self.last_start_s = time.monotonic() - t0

    def _format(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        argv = [
            *self._java(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(self.config_path),
        ]
        proc = ManagedProcess(argv, log_path=self.log_path, cwd=self.workdir, name="kafka-storage-format")
        deadline = time.monotonic() + self.start_timeout_s
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        code = proc.kill()  # reaps it (SIGKILL only if the deadline passed)
        if code != 0:
            raise ServerStartError(
                f"formatting the Kafka log dir {self.data_dir} failed (exit {code}).\n"
                f"log: {self.log_path}\n--- last lines ---\n{log_tail(self.log_path)}"
            )

    def _config(self) -> str:
        controller = f"{LOOPBACK}:{self._controller_port}"
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{controller}",
                # Loopback only: without a host a listener binds every interface.
                f"listeners=PLAINTEXT://{self.bootstrap},CONTROLLER://{controller}",
                f"advertised.listeners=PLAINTEXT://{self.bootstrap}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={self.data_dir}",
                # One node: every internal topic with one replica.
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                # Tests create their topics with the partitions they mean to have.
                "auto.create.topics.enable=false",
                # Few threads: the machine has two cores shared with Spark and the other servers.
                "num.network.threads=1",
                "num.io.threads=2",
                "background.threads=2",
                "num.recovery.threads.per.data.dir=1",
                "log.cleaner.threads=1",
                "",
            ]
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            self._proc.check_running(self._start_error)
            try:
                metadata = self.admin().list_topics(timeout=2)
                if any(b.id == 1 for b in metadata.brokers.values()):
                    return
            except KafkaException as e:
                last_error = repr(e)
            time.sleep(0.1)
        raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s (last probe: {last_error})")

    def _describe(self) -> str:
        return f"Kafka on {LOOPBACK}:{self._port}"

    def stop(self, timeout: float | None = None) -> None:
        """Graceful stop (SIGTERM; SIGKILL after ``timeout``). The log dir and ports are kept."""
        self._close_clients()
        super().stop(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash. Acknowledged records survive in the log dir for the next start()."""
        self._close_clients()
        super().kill()

    def _close_clients(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
        self._producer = None
        self._admin = None

    # -- clients -----------------------------------------------------------------------------------------
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": _CLIENT_LOG_LEVEL})
        return self._admin

    def create_topic(self, name: str, partitions: int = 1) -> None:
        futures = self.admin().create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        )
        futures[name].result(timeout=60)
        self._wait_partitions(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        """Grow ``name`` to ``total`` partitions (the admin API's CreatePartitions)."""
        futures = self.admin().create_partitions([NewPartitions(name, total)])
        futures[name].result(timeout=60)
        self._wait_partitions(name, total)
        # The producer's metadata is refreshed every few minutes; a new one knows the new partitions.
        if self._producer is not None:
            self._producer.flush(60)
            self._producer = None

    def _wait_partitions(self, name: str, count: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            topic = self.admin().list_topics(topic=name, timeout=10).topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == count
                and all(p.leader == 1 for p in topic.partitions.values())
            ):
                return
            time.sleep(0.1)
        raise HarnessError(f"topic {name} does not show {count} partitions with a leader after 60s")

    def produce(
        self, topic: str, records: Iterable[tuple[int, bytes | str]], *, key: str | None = None
    ) -> None:
        """Append ``(partition, value)`` records in order and wait until the broker acknowledged them all
        (an error fails the call: a test never runs on input the broker did not take)."""
        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "log_level": _CLIENT_LOG_LEVEL,
                }
            )
        errors: list[str] = []

        def delivered(error: object, message: object) -> None:
            if error is not None:
                errors.append(str(error))

        for partition, value in records:
            self._producer.produce(topic, value=value, key=key, partition=partition, on_delivery=delivered)
            self._producer.poll(0)
        left = self._producer.flush(60)
        if left or errors:
            raise HarnessError(f"producing to {topic}: {left} records unacknowledged, errors {errors[:5]}")

    def produce_ids(self, topic: str, ids: Iterable[int], partitions: int = 2) -> None:
        """``{"id": n}`` records, ``n`` into partition ``n % partitions``, in order."""
        self.produce(topic, [(n % partitions, json.dumps({"id": n})) for n in ids])

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The end offset of each partition of ``topic`` (the next offset to be written, what a reader's
        ``latest`` means), asked of the broker (ListOffsets), not taken from any batch's JSON."""
        partitions = self.admin().list_topics(topic=topic, timeout=10).topics[topic].partitions
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "harness-offsets",
                "log_level": _CLIENT_LOG_LEVEL,
            }
        )
        try:
            return {p: self._end_offset(consumer, TopicPartition(topic, p)) for p in sorted(partitions)}
        finally:
            consumer.close()

    @staticmethod
    def _end_offset(consumer: Consumer, partition: TopicPartition) -> int:
        """One partition's end offset, asked again while the broker answers a retriable error (a
        partition just created or grown: its leader is known to the controller a moment before the
        broker serves it)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return consumer.get_watermark_offsets(partition, timeout=30)[1]
            except KafkaException as e:
                error = e.args[0]
                if time.monotonic() > deadline or not (error.retriable() or error.code() in _NOT_SERVED_YET):
                    raise
            time.sleep(0.1)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"KafkaBroker({self._port and self.bootstrap}, {state}, workdir={self.workdir})"
