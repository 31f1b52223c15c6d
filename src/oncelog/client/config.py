"""Producer settings under Kafka's names, validated once at construction."""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from oncelog.client import config_keys
from oncelog.client.errors import ConfigError
from oncelog.client.security import ClientSecurity
from oncelog.protocol.compression import codec_for_name

log = logging.getLogger("oncelog.client")

DEFAULT_WINDOW = 5  # what every broker without KIP-1269 retains per producer and partition


class Idempotence(enum.Enum):
    OFF = "off"
    REQUESTED = "requested"  # idempotent where broker and topic format allow, plain elsewhere
    REQUIRED = "required"    # fail clearly where they do not

    @classmethod
    def parse(cls, value) -> Idempotence:
        if isinstance(value, Idempotence):
            return value
        if isinstance(value, bool):
            return cls.REQUIRED if value else cls.OFF
        v = str(value).strip().lower()
        if v == "true":
            return cls.REQUIRED
        if v == "false":
            return cls.OFF
        try:
            return cls(v)
        except ValueError:
            raise ConfigError(
                f"enable.idempotence must be off|requested|required|true|false, got {value!r}") from None


def _int(cfg: dict, name: str, default: int) -> int:
    v = cfg.get(name, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {v!r}") from None


def _flag(cfg: dict, name: str, default: bool) -> bool:
    v = cfg.get(name, default)
    if isinstance(v, bool):
        return v
    if str(v).strip().lower() in ("true", "false"):
        return str(v).strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, got {v!r}")


@dataclass
class ProducerConfig:
    bootstrap_servers: list[str]
    client_id: str = "oncelog-producer"
    acks: int = -1
    linger_ms: int = 5
    batch_size: int = 16384
    buffer_memory: int = 32 * 1024 * 1024
    max_block_ms: int = 60000
    compression: int = 0
    idempotence: Idempotence = Idempotence.REQUESTED
    max_in_flight: int = 5
    retries: int = 2**31 - 1
    retry_backoff_ms: int = 100
    delivery_timeout_ms: int = 120000
    request_timeout_ms: int = 30000
    max_request_size: int = 1048576
    metadata_max_age_ms: int = 300000
    allow_auto_create_topics: bool = True
    partitioner_ignore_keys: bool = False
    partitioner_adaptive: bool = True      # partitioner.adaptive.partitioning.enable
    address_map: Any = None                # oncelog.address.map: advertised -> reachable address
    transactional_id: str | None = None    # transactional.id: None = not transactional
    transaction_timeout_ms: int = 60000
    transaction_v2: bool = True            # oncelog.transaction.v2.enable: Transactions V2 where finalized
    two_phase_commit: bool = False         # transaction.two.phase.commit.enable (KIP-939)
    security: Any = None                   # client.security.ClientSecurity (security.protocol, sasl.*, ssl.*)

    @classmethod
    def from_dict(cls, cfg: dict) -> ProducerConfig:
        config_keys.check(cfg, "producer")
        servers = cfg.get("bootstrap.servers")
        if not servers:
            raise ConfigError("bootstrap.servers is required")
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        acks_raw = str(cfg.get("acks", "all")).lower()
        acks = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(acks_raw)
        if acks is None:
            raise ConfigError(f"acks must be all, -1, 0 or 1, got {cfg.get('acks')!r}")
        idem = Idempotence.parse(cfg.get("enable.idempotence", "requested"))
        tid = cfg.get("transactional.id")
        if tid is not None:
            # as Kafka: a transactional producer is idempotent, and refuses to be anything else
            if not str(tid):
                raise ConfigError("transactional.id must be a non-empty string")
            if "enable.idempotence" in cfg and idem is Idempotence.OFF:
                raise ConfigError("transactional.id requires enable.idempotence (it is "
                                  f"{cfg['enable.idempotence']!r})")
            idem = Idempotence.REQUIRED
        if acks == 0 and idem is not Idempotence.OFF:
            if idem is Idempotence.REQUIRED:
                raise ConfigError("enable.idempotence=required needs acks=all or acks=1, not acks=0")
            log.warning("acks=0 gives no acknowledgements to order by: idempotence turned off")
            idem = Idempotence.OFF
        try:
            codec = codec_for_name(cfg.get("compression.type", "none"))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        c = cls(
            bootstrap_servers=list(servers),
            client_id=str(cfg.get("client.id", "oncelog-producer")),
            acks=acks,
            linger_ms=_int(cfg, "linger.ms", 5),
            batch_size=_int(cfg, "batch.size", 16384),
            buffer_memory=_int(cfg, "buffer.memory", 32 * 1024 * 1024),
            max_block_ms=_int(cfg, "max.block.ms", 60000),
            compression=codec,
            idempotence=idem,
            # KIP-1269: no "at most 5" restriction; the per-partition window keeps dedup safe.
            max_in_flight=_int(cfg, "max.in.flight.requests.per.connection", 5),
            retries=_int(cfg, "retries", 2**31 - 1),
            retry_backoff_ms=_int(cfg, "retry.backoff.ms", 100),
            delivery_timeout_ms=_int(cfg, "delivery.timeout.ms", 120000),
            request_timeout_ms=_int(cfg, "request.timeout.ms", 30000),
            max_request_size=_int(cfg, "max.request.size", 1048576),
            metadata_max_age_ms=_int(cfg, "metadata.max.age.ms", 300000),
            security=ClientSecurity.from_config(cfg),
        )
        if c.max_in_flight < 1:
            raise ConfigError("max.in.flight.requests.per.connection must be at least 1")
        if c.retries < 0:
            raise ConfigError("retries must be >= 0")
        if c.retries == 0 and c.idempotence is not Idempotence.OFF:
            # as Kafka: without retries a knock-on OutOfOrderSequence (a batch behind one that
            # failed) would fail its records, and an unknown outcome could never be resolved
            if "enable.idempotence" in cfg:
                raise ConfigError("retries must be non-zero when using the idempotent producer "
                                  f"(enable.idempotence={cfg['enable.idempotence']})")
            log.warning("retries=0: idempotence turned off")
            c.idempotence = Idempotence.OFF
        least = c.linger_ms + c.request_timeout_ms
        if c.delivery_timeout_ms < least:
            # as Kafka's KafkaProducer.configureDeliveryTimeout
            if "delivery.timeout.ms" in cfg:
                raise ConfigError(f"delivery.timeout.ms={c.delivery_timeout_ms} must be at least "
                                  f"linger.ms + request.timeout.ms = {least}")
            log.warning("delivery.timeout.ms set to linger.ms + request.timeout.ms = %d", least)
            c.delivery_timeout_ms = least
        if c.batch_size < 1 or c.buffer_memory < c.batch_size:
            raise ConfigError("batch.size must be >= 1 and buffer.memory >= batch.size")
        if c.linger_ms < 0:
            raise ConfigError("linger.ms must be >= 0")
        c.allow_auto_create_topics = str(cfg.get("allow.auto.create.topics", "true")).lower() != "false"
        c.address_map = cfg.get("oncelog.address.map")
        c.partitioner_ignore_keys = _flag(cfg, "partitioner.ignore.keys", False)
        c.partitioner_adaptive = _flag(cfg, "partitioner.adaptive.partitioning.enable", True)
        c.transactional_id = None if tid is None else str(tid)
        c.transaction_timeout_ms = _int(cfg, "transaction.timeout.ms", 60000)
        # false: Transactions V1 whatever the cluster finalizes (to compare them, or to stay with
        # what librdkafka and the other Python clients speak)
        c.transaction_v2 = _flag(cfg, "oncelog.transaction.v2.enable", True)
        if c.transaction_timeout_ms < 1:
            raise ConfigError("transaction.timeout.ms must be positive")
        c.two_phase_commit = _flag(cfg, "transaction.two.phase.commit.enable", False)
        if c.two_phase_commit and c.transactional_id is None:
            raise ConfigError("transaction.two.phase.commit.enable needs a transactional.id")
        if c.two_phase_commit and "transaction.timeout.ms" in cfg:
            # Kafka's ProducerConfig refuses the pair: a two-phase-commit transaction has no timeout
            raise ConfigError("transaction.timeout.ms cannot be set with transaction.two.phase.commit.enable=true")
        if c.transactional_id is not None and c.acks != -1:
            # as Kafka's ProducerConfig: a commit must cover only durable records, and only an
            # acks=all answer waits for that (on oncelog, for the fsync)
            raise ConfigError("transactional.id needs acks=all")
        return c
