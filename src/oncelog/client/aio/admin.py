"""Asyncio admin client: topics, configs (incremental), delete records, producers and
transactions."""
from __future__ import annotations

import asyncio
from typing import NamedTuple

from oncelog.client import config_keys
from oncelog.client.aio import wire
from oncelog.client.aio.admin_base import AdminError
from oncelog.client.aio.admin_base import request as _request
from oncelog.client.aio.admin_cluster import BROKER_RESOURCE, TOPIC_RESOURCE, ClusterAdmin, alter_configs
from oncelog.client.aio.admin_groups import GroupAdmin
from oncelog.client.aio.admin_security import QuotaAdmin, SecurityAdmin
from oncelog.client.aio.admin_share_groups import ShareGroupAdmin
from oncelog.client.aio.admin_transactions import TransactionAdmin
from oncelog.client.aio.cluster import Cluster
from oncelog.client.errors import KafkaClientError
from oncelog.client.security import ClientSecurity
from oncelog.client.types import TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode


class NewTopic(NamedTuple):
    name: str
    num_partitions: int = 1
    replication_factor: int = 1
    config: dict | None = None


async def describe_topic_config(cluster: Cluster, topic: str, keys: list[str] | None = None,
                                resource_type: int = TOPIC_RESOURCE) -> dict[str, str | None]:
    def build(v):
        rq = RequestBuilder(ApiKey.DESCRIBE_CONFIGS, v)
        res = rq("DescribeConfigsResource", resource_type=resource_type, resource_name=topic,
                 configuration_keys=tuple(keys) if keys else None)
        return rq.encode(resources=(res,), include_synonyms=False, include_documentation=False)

    def parse(v, body):
        r = wire.decode(ApiKey.DESCRIBE_CONFIGS, v, body)
        out = {}
        for res in r.results:
            if res.error_code:
                raise AdminError(res.error_code, f"describe configs of {topic}", res.error_message)
            for c in res.configs:
                out[c.name] = c.value
        return out
    return await _request(cluster, ApiKey.DESCRIBE_CONFIGS, build, parse)


class AIOAdminClient(GroupAdmin, ShareGroupAdmin, SecurityAdmin, QuotaAdmin, ClusterAdmin, TransactionAdmin):
    def __init__(self, config: dict) -> None:
        config_keys.check(config, "admin")
        self.config = dict(config)
        servers = config.get("bootstrap.servers")
        if not servers:
            raise KafkaClientError("bootstrap.servers is required")
        self.cluster = Cluster(servers, str(config.get("client.id", "oncelog-admin")),
                               int(config.get("request.timeout.ms", 30000)), allow_auto_create=False,
                               address_map=config.get("oncelog.address.map"),
                               security=ClientSecurity.from_config(config))

    async def start(self) -> AIOAdminClient:
        await self.cluster.any_connection()
        await self.cluster.refresh([])
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        self.cluster.close()

    async def create_topics(self, topics, *, num_partitions: int = 1, replication_factor: int = 1,
                            config: dict | None = None, timeout_ms: int = 30000,
                            exist_ok: bool = False) -> None:
        """Creates them all, or raises the first topic's refusal (AdminError)."""
        outcomes = await self.create_topics_each(topics, num_partitions=num_partitions,
                                                 replication_factor=replication_factor, config=config,
                                                 timeout_ms=timeout_ms, exist_ok=exist_ok)
        for error in outcomes.values():
            if error is not None:
                raise error

    async def create_topics_each(self, topics, *, num_partitions: int = 1, replication_factor: int = 1,
                                 config: dict | None = None, timeout_ms: int = 30000,
                                 exist_ok: bool = False) -> dict[str, AdminError | None]:
        """One CreateTopics request: each topic's refusal (AdminError), or None once it is
        created and in the metadata (the sync AdminClient's futures per topic)."""
        new = [t if isinstance(t, NewTopic) else NewTopic(t, num_partitions, replication_factor, config)
               for t in topics]

        def build(v):
            rq = RequestBuilder(ApiKey.CREATE_TOPICS, v)
            ts = tuple(rq("CreatableTopic", name=t.name, num_partitions=t.num_partitions,
                          replication_factor=t.replication_factor, assignments=(),
                          configs=tuple(rq("CreatableTopicConfig", name=k, value=str(val))
                                        for k, val in (t.config or {}).items()))
                       for t in new)
            return rq.encode(topics=ts, timeout=timeout_ms, validate_only=False)

        def parse(v, body) -> dict[str, AdminError | None]:
            r = wire.decode(ApiKey.CREATE_TOPICS, v, body)
            out: dict[str, AdminError | None] = {}
            for t in r.topics:
                if t.error_code and not (t.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and exist_ok):
                    out[t.name] = AdminError(t.error_code, f"create topic {t.name}",
                                             getattr(t, "error_message", None))
                else:
                    out[t.name] = None
            return out
        outcomes = await _request(self.cluster, ApiKey.CREATE_TOPICS, build, parse, controller=True)
        for t in new:
            if outcomes.get(t.name, None) is None:
                await self.cluster.topic(t.name, timeout_ms / 1000)
        return {t.name: outcomes.get(t.name) for t in new}

    async def delete_topics(self, names: list[str], *, timeout_ms: int = 30000) -> None:
        """Deletes them all, or raises the first topic's refusal (AdminError)."""
        for error in (await self.delete_topics_each(names, timeout_ms=timeout_ms)).values():
            if error is not None:
                raise error

    async def delete_topics_each(self, names: list[str], *, timeout_ms: int = 30000) -> dict[str, AdminError | None]:
        """One DeleteTopics request: each topic's refusal (AdminError, e.g. UNKNOWN_TOPIC_OR_PARTITION),
        or None once it is deleted (the sync AdminClient's futures per topic)."""
        def build(v):
            if v >= 6:
                raise KafkaClientError("DeleteTopics v6+ not used")
            return RequestBuilder(ApiKey.DELETE_TOPICS, v).encode(topic_names=tuple(names), timeout=timeout_ms)

        def parse(v, body) -> dict[str, AdminError | None]:
            r = wire.decode(ApiKey.DELETE_TOPICS, v, body)
            return {t.name: AdminError(t.error_code, f"delete topic {t.name}", getattr(t, "error_message", None))
                    if t.error_code else None for t in r.responses}
        outcomes = await _request(self.cluster, ApiKey.DELETE_TOPICS, build, parse, controller=True)
        for n in names:
            if outcomes.get(n) is None:
                self.cluster.topics.pop(n, None)
        return {n: outcomes.get(n) for n in names}

    async def describe_configs(self, topic: str, keys: list[str] | None = None) -> dict[str, str | None]:
        return await describe_topic_config(self.cluster, topic, keys)

    async def describe_broker_configs(self, node: int | None, keys: list[str] | None = None) -> dict:
        """A broker's configs; node None = any broker the metadata names."""
        if node is None:
            if not self.cluster.brokers:
                await self.cluster.refresh([])
            node = min(self.cluster.brokers)
        return await describe_topic_config(self.cluster, str(node), keys, BROKER_RESOURCE)

    async def alter_configs(self, topic: str, configs: dict[str, str | None]) -> None:
        """Incremental: a value sets the key, None deletes the override."""
        await alter_configs(self.cluster, TOPIC_RESOURCE, topic, configs)

    async def list_topics(self) -> dict[str, int]:
        """Topic name -> partition count."""
        info = await self.cluster.refresh(None)
        return {n: len(t.partitions) for n, t in info.topics.items() if t.error_code == 0}

    async def delete_records(self, offsets: dict) -> dict:
        """{(topic, partition): offset} -> {(topic, partition): new low watermark}; sent to leaders."""
        by_leader: dict[int, dict] = {}
        for (topic, part), off in offsets.items():
            t = await self.cluster.topic(topic, self.cluster.timeout_s)
            leader = t.partitions[part].leader_id
            by_leader.setdefault(leader, {}).setdefault(topic, []).append((part, off))
        out = {}
        for leader, topics in by_leader.items():
            conn = await self.cluster.connection(leader)
            v = conn.version(ApiKey.DELETE_RECORDS)
            if v is None:
                raise KafkaClientError("broker does not support DeleteRecords")
            rq = RequestBuilder(ApiKey.DELETE_RECORDS, v)
            req = rq.encode(timeout=30000, topics=tuple(
                rq("DeleteRecordsTopic", name=t, partitions=tuple(
                    rq("DeleteRecordsPartition", partition_index=p, offset=o) for p, o in ps))
                for t, ps in topics.items()))
            body = await asyncio.wait_for(conn.request(ApiKey.DELETE_RECORDS, v, req), self.cluster.timeout_s)
            r = wire.decode(ApiKey.DELETE_RECORDS, v, body)
            for t in r.topics:
                for p in t.partitions:
                    if p.error_code:
                        raise AdminError(p.error_code, f"delete records of {t.name}-{p.partition_index}")
                    out[(t.name, p.partition_index)] = p.low_watermark
        return out

    async def describe_producers(self, topic: str, partition: int) -> list[dict]:
        """Active producers of one partition (DescribeProducers, asked of its leader): id, epoch
        and last sequence of each (`partition_producers` has all DescribeProducers tells)."""
        return [{"producer_id": p.producer_id, "producer_epoch": p.producer_epoch, "last_sequence": p.last_sequence}
                for p in await self.partition_producers(TopicPartition(topic, partition))]

    async def list_transactions(self, states: list[str] | None = None, duration_ms: int = -1) -> list[dict]:
        """Transactions of the whole cluster (ListTransactions, asked of every broker: each
        lists those its coordinator owns), optionally only in the given states (Kafka's names:
        "Ongoing", "PrepareCommit", ...): [{"transactional_id", "producer_id", "state"}], only
        the ids this client may DESCRIBE. `duration_ms` >= 0: only transactions running longer
        than that (ListTransactions v1, KIP-994; KIP-939's operators look for prepared
        transactions nobody completes this way)."""
        if not self.cluster.brokers:
            await self.cluster.refresh([])
        rq_states = tuple(states or ())
        out: list[dict] = []
        for node in sorted(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            v = conn.version(ApiKey.LIST_TRANSACTIONS)
            if v is None:
                raise KafkaClientError(f"broker {conn.addr} does not support ListTransactions")
            if duration_ms >= 0 and v < 1:
                raise KafkaClientError(f"broker {conn.addr} cannot filter transactions by duration "
                                       "(ListTransactions v1)")
            req = RequestBuilder(ApiKey.LIST_TRANSACTIONS, v).encode(
                state_filters=rq_states, producer_id_filters=(), duration_filter=duration_ms)
            body = await asyncio.wait_for(conn.request(ApiKey.LIST_TRANSACTIONS, v, req),
                                          self.cluster.timeout_s)
            r = wire.decode(ApiKey.LIST_TRANSACTIONS, v, body)
            if r.error_code:
                raise AdminError(r.error_code, f"list transactions of broker {node}")
            out += [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                     "state": t.transaction_state} for t in r.transaction_states]
        return out
