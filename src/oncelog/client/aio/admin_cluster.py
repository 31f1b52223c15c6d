"""The cluster and its configuration as the admin client sees them (kafka-configs',
kafka-topics' --alter and kafka-broker-api-versions' requests): brokers and controller from
Metadata, each configuration entry with its source (DescribeConfigs), incremental changes to a
topic's or a broker's settings (IncrementalAlterConfigs, a broker's asked of that broker),
partitions added (CreatePartitions), and the offsets that bound each partition."""
from __future__ import annotations

from typing import NamedTuple

from oncelog.client.aio import wire
from oncelog.client.aio.admin_base import AdminError, ask, request
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.list_offsets import list_offsets
from oncelog.client.types import EARLIEST, LATEST, TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode, error_code

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
# Kafka's ConfigSource ids, as DescribeConfigs answers them
CONFIG_SOURCES = {0: "UNKNOWN", 1: "TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
                  4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG"}


class ConfigEntry(NamedTuple):
    name: str
    value: str | None        # None: sensitive (hidden) or unset
    source: str              # CONFIG_SOURCES' names
    read_only: bool
    sensitive: bool


class BrokerInfo(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


class ClusterInfo(NamedTuple):
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


class TopicListing(NamedTuple):
    name: str
    partitions: int
    internal: bool           # Kafka's internal topics (__consumer_offsets, __transaction_state)


class PartitionInfo(NamedTuple):
    partition: int
    leader: int
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int


def _alter_configs_request(resource_type: int, name: str, configs: dict[str, str | None]):
    def build(v: int) -> bytes:
        rq = RequestBuilder(ApiKey.INCREMENTAL_ALTER_CONFIGS, v)
        items = tuple(rq("AlterableConfig", name=k, config_operation=0 if val is not None else 1,
                         value=None if val is None else str(val)) for k, val in configs.items())
        res = rq("AlterConfigsResource", resource_type=resource_type, resource_name=name, configs=items)
        return rq.encode(resources=(res,), validate_only=False)

    def parse(v: int, body) -> None:
        r = wire.decode(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, body)
        for res in r.responses:
            if res.error_code:
                raise AdminError(res.error_code, f"alter configs of {name}", res.error_message)
    return build, parse


async def alter_configs(cluster: Cluster, resource_type: int, name: str, configs: dict[str, str | None]) -> None:
    """Incremental: a value sets the key, None deletes the override."""
    build, parse = _alter_configs_request(resource_type, name, configs)
    await request(cluster, ApiKey.INCREMENTAL_ALTER_CONFIGS, build, parse)


class ClusterAdmin:
    """The admin client's cluster, configuration and partition methods (mixed into
    AIOAdminClient)."""

    cluster: Cluster

    async def describe_cluster(self) -> ClusterInfo:
        info = await self.cluster.refresh([])
        return ClusterInfo(info.cluster_id, info.controller_id, tuple(
            BrokerInfo(b.node_id, b.host, b.port, b.rack) for _, b in sorted(info.brokers.items())))

    async def topic_listings(self) -> list[TopicListing]:
        info = await self.cluster.refresh(None)
        return sorted(TopicListing(name, len(t.partitions), t.is_internal)
                      for name, t in info.topics.items() if t.error_code == 0)

    async def config_entries(self, resource_type: int, name: str) -> list[ConfigEntry]:
        """Every setting of a topic (TOPIC_RESOURCE, its name) or a broker (BROKER_RESOURCE, its
        node id, asked of that broker)."""
        if resource_type == BROKER_RESOURCE:
            if not self.cluster.brokers:
                await self.cluster.refresh([])
            conn = await self.cluster.connection(int(name))
        else:
            conn = await self.cluster.any_connection()
        _, r = await ask(conn, ApiKey.DESCRIBE_CONFIGS, lambda rq: rq.encode(
            resources=(rq("DescribeConfigsResource", resource_type=resource_type, resource_name=name,
                          configuration_keys=None),),
            include_synonyms=False, include_documentation=False), self.cluster.timeout_s)
        out = []
        for res in r.results:
            if res.error_code:
                raise AdminError(res.error_code, f"describe configs of {name}", res.error_message)
            out += [ConfigEntry(c.name, c.value, CONFIG_SOURCES.get(int(c.config_source), str(c.config_source)),
                                bool(c.read_only), bool(c.is_sensitive)) for c in res.configs]
        return out

    async def describe_log_dirs(self, topics: list[str] | None = None) -> list[dict]:
        """DescribeLogDirs of every broker (kafka-log-dirs.sh --describe): per broker and log
        directory its volume's total and usable bytes (-1 before v4) and each partition's size;
        `topics` limits the partitions to those topics' (None: all)."""
        if not self.cluster.brokers:
            await self.cluster.refresh([])
        wanted = None
        if topics is not None:
            # describe_partitions: an unknown topic is refused (UNKNOWN_TOPIC_OR_PARTITION), not waited for
            wanted = [(t, [p.partition for p in await self.describe_partitions(t)]) for t in topics]
        out: list[dict] = []
        for node in sorted(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            _v, r = await ask(conn, ApiKey.DESCRIBE_LOG_DIRS, lambda rq: rq.encode(
                topics=None if wanted is None else tuple(
                    rq("DescribableLogDirTopic", topic=t, partitions=tuple(ps)) for t, ps in wanted)),
                self.cluster.timeout_s)
            if getattr(r, "error_code", 0):
                raise AdminError(r.error_code, f"describe the log directories of broker {node}")
            for res in r.results:
                error = error_code(res.error_code).name if res.error_code else None
                out.append({"broker": node, "log_dir": str(res.log_dir), "error": error,
                            "total_bytes": int(getattr(res, "total_bytes", -1)),
                            "usable_bytes": int(getattr(res, "usable_bytes", -1)),
                            "partitions": [{"topic": str(t.name), "partition": int(p.partition_index),
                                            "size_bytes": int(p.partition_size), "offset_lag": int(p.offset_lag)}
                                           for t in res.topics for p in t.partitions]})
        return out

    async def alter_broker_configs(self, node: int, configs: dict[str, str | None]) -> None:
        """Incremental, asked of broker `node` itself (each broker owns its settings)."""
        if not self.cluster.brokers:
            await self.cluster.refresh([])
        build, parse = _alter_configs_request(BROKER_RESOURCE, str(node), configs)
        await request(self.cluster, ApiKey.INCREMENTAL_ALTER_CONFIGS, build, parse,
                      conn=await self.cluster.connection(node))

    async def create_partitions(self, topic: str, total: int, timeout_ms: int = 30000) -> None:
        """Grow `topic` to `total` partitions."""
        def build(v: int) -> bytes:
            rq = RequestBuilder(ApiKey.CREATE_PARTITIONS, v)
            return rq.encode(topics=(rq("CreatePartitionsTopic", name=topic, count=total, assignments=None),),
                             timeout=timeout_ms, validate_only=False)

        def parse(v: int, body) -> None:
            r = wire.decode(ApiKey.CREATE_PARTITIONS, v, body)
            for res in r.results:
                if res.error_code:
                    raise AdminError(res.error_code, f"add partitions to {topic}", res.error_message)
        await request(self.cluster, ApiKey.CREATE_PARTITIONS, build, parse, controller=True)
        self.cluster.topics.pop(topic, None)

    async def list_offsets(self, tps, spec, isolation_level: int = 0) -> dict[TopicPartition, int | None]:
        """ListOffsets at each partition's leader: `spec` EARLIEST, LATEST or a time in ms (None
        where no record is that recent)."""
        return await list_offsets(self.cluster, tps, spec, isolation_level)

    async def describe_partitions(self, topic: str, isolation_level: int = 0) -> list[PartitionInfo]:
        """Leader and offsets (log start, log end: the high watermark, or with isolation level 1
        the last stable offset) of each partition of `topic`."""
        info = await self.cluster.refresh([topic])   # fresh: partitions may have been added
        code = info.topics[topic].error_code if topic in info.topics else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if code:
            unknown = code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            raise AdminError(code, f"describe topic {topic}", "no such topic" if unknown else None)
        t = await self.cluster.topic(topic, self.cluster.timeout_s)
        tps = [TopicPartition(topic, p.index) for p in t.partitions]
        start = await self.list_offsets(tps, EARLIEST, isolation_level)
        end = await self.list_offsets(tps, LATEST, isolation_level)
        return [PartitionInfo(p.index, p.leader_id, p.leader_epoch, start[tp] or 0, end[tp] or 0)
                for p, tp in zip(t.partitions, tps)]
