"""Client quotas with Kafka's arithmetic, the clock passed in.

Rate (Kafka's `Rate` over a `SampledStat`): values are summed into `quota.window.num` (11)
samples of `quota.window.size.seconds` (1 s); the rate is the sum of the live samples divided by
the time since the oldest one began, but never by less than `num - 1` whole windows (so one burst
on an idle client is not read as a huge rate). A value is recorded first, then the rate is
checked; over the quota, the throttle time is (rate - quota) / quota * window (`QuotaUtils`),
i.e. how long the client must stay silent for the rate to fall back to the quota. The request
quota caps it at one window.

Which quota applies, and which clients share it (ClientQuotaManager.DefaultQuotaCallback): the
most specific configured entity of
    user+client-id, user+<default client-id>, user, <default user>+client-id,
    <default user>+<default client-id>, <default user>, client-id, <default client-id>
gives the limit. The rate is tracked per (user, client-id) for the two-part entities and per
user or per client-id for the one-part ones: all clients of a user share a user quota, each
client id gets its own copy of a default client-id quota.

Quota settings live in the metadata log (Kafka's ClientQuotaRecord):
    {"type": "client_quota", "entity": {"user": str|null, "client-id": str|null, "ip": ...},
     "key": str, "value": float, "remove": bool}
An entity part that is null is the default entity (`<default>`); an absent part is not in the
entity. AlterClientQuotas is decided into such records and replayed (`ClientQuotaStore`).

Connection limits (`max.connections`, `max.connections.per.ip`, `...per.ip.overrides`, the
creation rates and the `ip` entities' `connection_creation_rate`) are `connection_quotas`'.
"""
from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oncelog.protocol.errors import ErrorCode

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
USER, CLIENT_ID, IP = "user", "client-id", "ip"
QUOTA_RECORD = "client_quota"
INACTIVE_SENSOR_EXPIRATION_MS = 3600 * 1000   # Kafka drops a client's sensors after an idle hour

# key -> (entity kind, integral?) (QuotaConfig: LONG keys must be whole numbers)
QUOTA_KEYS: dict[str, tuple[str, bool]] = {
    PRODUCER_BYTE_RATE: ("client", True), CONSUMER_BYTE_RATE: ("client", True),
    REQUEST_PERCENTAGE: ("client", False), CONTROLLER_MUTATION_RATE: ("client", False),
    CONNECTION_CREATION_RATE: ("ip", True),
}
_INT_MAX = 2**31 - 1


class _Default:
    """The default entity (`<default>`), distinct from any name."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "<default>"


DEFAULT = _Default()


@dataclass(frozen=True)
class QuotaEntity:
    user: Any = None          # str, DEFAULT, or None (no user part)
    client_id: Any = None
    ip: Any = None

    def parts(self) -> dict[str, str | None]:
        """As ClientQuotaRecord's entity: type -> name, None for the default entity."""
        out = {}
        for kind, value in ((USER, self.user), (CLIENT_ID, self.client_id), (IP, self.ip)):
            if value is not None:
                out[kind] = None if value is DEFAULT else value
        return out

    @classmethod
    def from_parts(cls, parts: Mapping[str, str | None]) -> QuotaEntity:
        def get(k: str) -> str | _Default | None:
            if k not in parts:
                return None
            v = parts[k]
            return DEFAULT if v is None else v

        return cls(get(USER), get(CLIENT_ID), get(IP))

    def __str__(self) -> str:
        return " ".join(f"{k} {v if v is not None else '<default>'}" for k, v in self.parts().items())


# ------------------------------------------------------------------ the rate

class Rate:
    """Kafka's Rate(SampledStat(WindowedSum)), per second."""
    __slots__ = ("samples", "window_ms", "_starts", "_last", "_values", "_current")

    def __init__(self, samples: int = 11, window_ms: int = 1000) -> None:
        self.samples, self.window_ms = samples, window_ms
        self._starts: list[int] = []
        self._last: list[int] = []
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._starts:
            self._new(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self.window_ms:
            i = self._current = (i + 1) % (self.samples + 1)  # one spare for an overlapping sample
            if i >= len(self._starts):
                self._new(now_ms)
            else:
                self._starts[i] = self._last[i] = now_ms
                self._values[i] = 0.0
        self._values[i] += value
        self._last[i] = now_ms

    def _new(self, now_ms: int) -> None:
        self._starts.append(now_ms)
        self._last.append(now_ms)
        self._values.append(0.0)

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for i in range(len(self._starts)):
            if now_ms - self._last[i] >= expire:
                self._starts[i] = self._last[i] = now_ms
                self._values[i] = 0.0

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        if not self._starts:
            self._new(now_ms)
        elapsed = now_ms - min(self._starts)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def total(self, now_ms: int) -> float:
        """The sum of the samples still inside the monitored window."""
        self._purge(now_ms)
        return sum(self._values)

    def measure(self, now_ms: int) -> float:
        """Units per second."""
        total = self.total(now_ms)
        return total / (self.window_size_ms(now_ms) / 1000.0)

    @property
    def last_record_ms(self) -> int:
        return max(self._last) if self._last else -1


def throttle_time_ms(observed: float, quota: float, window_ms: int) -> int:
    """Kafka's QuotaUtils.throttleTime: (O - T) / T * W, rounded (Java's Math.round)."""
    return int(math.floor((observed - quota) / quota * window_ms + 0.5))


# ------------------------------------------------------------------ which quota, which sensor

def _lookup_order(user: str, client_id: str) -> list[tuple[QuotaEntity, tuple[str, str]]]:
    """Kafka's precedence, each entity with the (user, client-id) tags of the sensor that
    counts against it ("" for a tag that is not used)."""
    return [
        (QuotaEntity(user, client_id), (user, client_id)),
        (QuotaEntity(user, DEFAULT), (user, client_id)),
        (QuotaEntity(user), (user, "")),
        (QuotaEntity(DEFAULT, client_id), (user, client_id)),
        (QuotaEntity(DEFAULT, DEFAULT), (user, client_id)),
        (QuotaEntity(DEFAULT), (user, "")),
        (QuotaEntity(None, client_id), ("", client_id)),
        (QuotaEntity(None, DEFAULT), ("", client_id)),
    ]


@dataclass
class _Sensor:
    rate: Rate
    last_ms: int


class ClientQuotaManager:
    """One quota type (`producer_byte_rate`, `consumer_byte_rate` or `request_percentage`).
    `overrides` maps QuotaEntity -> limit for this key and is read at every call, so a replayed
    change applies to the next request (pass `ClientQuotaStore.overrides(key)`)."""

    def __init__(self, overrides: Mapping[QuotaEntity, float], samples: int = 11, window_s: int = 1,
                 max_throttle_ms: int | None = None) -> None:
        self.overrides = overrides
        self.samples, self.window_ms = samples, window_s * 1000
        self.max_throttle_ms = max_throttle_ms
        self._sensors: dict[tuple[str, str], _Sensor] = {}

    def resolve(self, user: str, client_id: str) -> tuple[float | None, tuple[str, str]]:
        """(the limit, the sensor's tags) for this user (principal name) and client id."""
        if not self.overrides:
            return None, ("", client_id)
        for entity, tags in _lookup_order(user, client_id):
            limit = self.overrides.get(entity)
            if limit is not None:
                return limit, tags
        return None, ("", client_id)

    def quota(self, user: str, client_id: str) -> float | None:
        return self.resolve(user, client_id)[0]

    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Count `value` (bytes, or request-thread percent) and return the throttle time in ms."""
        limit, tags = self.resolve(user, client_id)
        if limit is None:
            return 0
        sensor = self._sensors.get(tags)
        if sensor is None:
            sensor = self._sensors[tags] = _Sensor(Rate(self.samples, self.window_ms), now_ms)
        sensor.rate.record(value, now_ms)
        sensor.last_ms = now_ms
        observed = sensor.rate.measure(now_ms)
        if observed <= limit:
            return 0
        throttle = throttle_time_ms(observed, limit, sensor.rate.window_size_ms(now_ms))
        return min(throttle, self.max_throttle_ms) if self.max_throttle_ms is not None else throttle

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take back a value already counted (a throttled Fetch returns no data: Kafka's
        unrecordQuotaSensor)."""
        limit, tags = self.resolve(user, client_id)
        sensor = self._sensors.get(tags)
        if limit is not None and sensor is not None:
            sensor.rate.record(-value, now_ms)

    def max_value_in_window(self, user: str, client_id: str) -> float:
        """The most that can be recorded at once without certain throttling (bounds a Fetch)."""
        limit = self.quota(user, client_id)
        return math.inf if limit is None else limit * (self.samples - 1) * self.window_ms / 1000

    def expire(self, now_ms: int) -> int:
        """Forget sensors idle for an hour; returns how many were dropped."""
        old = [k for k, s in self._sensors.items() if now_ms - s.last_ms >= INACTIVE_SENSOR_EXPIRATION_MS]
        for k in old:
            del self._sensors[k]
        return len(old)


def request_percentage(thread_time_ns: int) -> float:
    """Request-thread time as Kafka's request quota counts it (100 = one thread for a second)."""
    return thread_time_ns * 100.0 / 1e9


# ------------------------------------------------------------------ the settings (metadata log)

@dataclass(frozen=True)
class QuotaOp:
    key: str
    value: float
    remove: bool = False


@dataclass(frozen=True)
class QuotaAlteration:
    entity: Sequence[tuple[str, str | None]]     # (entity type, name or None for the default)
    ops: Sequence[QuotaOp]


@dataclass(frozen=True)
class FilterComponent:
    entity_type: str
    match_type: int                  # 0 exact, 1 default, 2 any specified
    match: str | None = None


MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


def alterations_from_wire(entries: Any) -> list[QuotaAlteration]:
    """AlterClientQuotas' entries (kio entities or anything shaped like them)."""
    return [QuotaAlteration(tuple((str(e.entity_type), e.entity_name) for e in entry.entity),
                            tuple(QuotaOp(str(o.key), float(o.value), bool(o.remove)) for o in entry.ops))
            for entry in entries]


class ClientQuotaStore:
    def __init__(self) -> None:
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._by_key: dict[str, dict[QuotaEntity, float]] = {k: {} for k in QUOTA_KEYS}

    def overrides(self, key: str) -> Mapping[QuotaEntity, float]:
        """A live view: entity -> value for one key (what a ClientQuotaManager reads)."""
        return self._by_key[key]

    def quotas(self, entity: QuotaEntity) -> dict[str, float]:
        return dict(self._quotas.get(entity, {}))

    # ------------------------------------------------------------------ decide (no change)
    def decide_alter(self, alterations: Sequence[QuotaAlteration]) -> tuple[
            list[dict[str, Any]], list[tuple[Sequence[tuple[str, str | None]], ErrorCode, str | None]]]:
        """AlterClientQuotas (Kafka's ClientQuotaControlManager.alterClientQuotas): per entity
        (error code, message); records only for values that change. With validate_only the
        caller drops the records."""
        records: list[dict[str, Any]] = []
        results: list[tuple[Sequence[tuple[str, str | None]], ErrorCode, str | None]] = []
        seen: set[tuple[tuple[str, str | None], ...]] = set()
        for alt in alterations:
            key_of_entity = tuple(sorted(alt.entity, key=lambda p: p[0]))
            if key_of_entity in seen:
                results.append((alt.entity, ErrorCode.INVALID_REQUEST, f"Ignoring duplicate entity {alt.entity}"))
                continue
            seen.add(key_of_entity)
            error, new = self._decide_one(alt)
            if error:
                results.append((alt.entity, error[0], error[1]))
            else:
                records.extend(new)
                results.append((alt.entity, ErrorCode.NONE, None))
        return records, results

    def _decide_one(self, alt: QuotaAlteration) -> tuple[tuple[ErrorCode, str] | None, list[dict[str, Any]]]:
        bad = ErrorCode.INVALID_REQUEST
        parts: dict[str, str | None] = {}
        if not alt.entity:
            return (bad, "Invalid empty client quota entity"), []
        for kind, name in alt.entity:
            if kind in parts:
                return (bad, f"Invalid client quota entity, duplicate entity entry {kind}"), []
            if kind not in (USER, CLIENT_ID, IP):
                return (bad, f"Unhandled client quota entity type: {kind}"), []
            if name is not None and name == "":
                return (bad, f"Empty {kind} not supported"), []
            parts[kind] = name
        if IP in parts:
            if USER in parts or CLIENT_ID in parts:
                return (bad, "Invalid quota entity combination, IP entity should not be combined with User or "
                             "ClientId"), []
            ip = parts[IP]
            if ip is not None and not _is_ip(ip):
                return (bad, f"{ip} is not a valid IP or resolvable host."), []
            kind_allowed = "ip"
        else:
            kind_allowed = "client"
        ops: dict[str, QuotaOp] = {}
        for op in alt.ops:
            if op.key in ops:
                return (bad, f"Duplicate quota key {op.key} not updating quota for this entity"), []
            ops[op.key] = op
        entity = QuotaEntity.from_parts(parts)
        current = self._quotas.get(entity, {})
        records = []
        for op in ops.values():
            if op.remove:
                if op.key in current:
                    records.append(self._record(parts, op.key, 0.0, True))
                continue
            spec = QUOTA_KEYS.get(op.key)
            if spec is None or spec[0] != kind_allowed:
                return (bad, f"Invalid configuration key {op.key}"), []
            if not op.value > 0.0:
                return (bad, f"Quota {op.key} must be greater than 0"), []
            if spec[1]:
                limit = _INT_MAX if op.key == CONNECTION_CREATION_RATE else 2**63 - 1
                if op.value > limit:
                    return (bad, f"Proposed value for {op.key} is too large for "
                                 f"{'an INT' if limit == _INT_MAX else 'a LONG'}."), []
                if abs(op.value % 1.0) > 1e-6:
                    return (bad, f"{op.key} cannot be a fractional value."), []
            if current.get(op.key) != op.value:
                records.append(self._record(parts, op.key, float(op.value), False))
        return None, records

    @staticmethod
    def _record(parts: dict[str, str | None], key: str, value: float, remove: bool) -> dict[str, Any]:
        return {"type": QUOTA_RECORD, "entity": dict(parts), "key": key, "value": value, "remove": remove}

    def describe(self, components: Sequence[FilterComponent], strict: bool) -> tuple[
            ErrorCode, str | None, list[tuple[QuotaEntity, dict[str, float]]]]:
        """DescribeClientQuotas: entities whose parts match every component; `strict` also
        excludes entities with parts the filter does not mention."""
        kinds = [c.entity_type for c in components]
        if len(set(kinds)) != len(kinds):
            return ErrorCode.INVALID_REQUEST, "Duplicate entity type in filter", []
        for c in components:
            if c.entity_type not in (USER, CLIENT_ID, IP):
                return ErrorCode.INVALID_REQUEST, f"Unknown entity type: {c.entity_type}", []
            if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
                return ErrorCode.INVALID_REQUEST, f"Unknown match type: {c.match_type}", []
            if c.match_type == MATCH_EXACT and c.match is None:
                return ErrorCode.INVALID_REQUEST, "A null match for an exact match type is not allowed", []
        if IP in kinds and (USER in kinds or CLIENT_ID in kinds):
            return ErrorCode.INVALID_REQUEST, "Invalid entity filter component combination, IP filter " \
                                              "component should not be used with user or clientId filter " \
                                              "component.", []
        out = []
        for entity, values in self._quotas.items():
            parts = entity.parts()
            if strict and set(parts) != set(kinds):
                continue
            if not all(_component_matches(c, parts) for c in components):
                continue
            out.append((entity, dict(values)))
        out.sort(key=lambda ev: str(ev[0]))
        return ErrorCode.NONE, None, out

    # ------------------------------------------------------------------ the only change
    def replay(self, record: dict[str, Any]) -> None:
        if record.get("type") != QUOTA_RECORD:
            raise ValueError(f"not a client quota record: {record.get('type')!r}")
        try:
            parts, key = dict(record["entity"]), str(record["key"])
            value, remove = float(record.get("value", 0.0)), bool(record.get("remove", False))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad client quota record {record!r}: {e}") from None
        if key not in QUOTA_KEYS or not parts or set(parts) - {USER, CLIENT_ID, IP}:
            raise ValueError(f"bad client quota record {record!r}")
        entity = QuotaEntity.from_parts(parts)
        values = self._quotas.setdefault(entity, {})
        if remove:
            values.pop(key, None)
            self._by_key[key].pop(entity, None)
            if not values:
                del self._quotas[entity]
        else:
            values[key] = value
            self._by_key[key][entity] = value

    def to_snapshot(self) -> list[dict[str, Any]]:
        return [self._record(e.parts(), k, v, False)
                for e, values in sorted(self._quotas.items(), key=lambda ev: str(ev[0]))
                for k, v in sorted(values.items())]

    @classmethod
    def from_snapshot(cls, records: Iterable[dict[str, Any]]) -> ClientQuotaStore:
        store = cls()
        for r in records:
            store.replay(r)
        return store


def _component_matches(c: FilterComponent, parts: Mapping[str, str | None]) -> bool:
    if c.entity_type not in parts:
        return False
    value = parts[c.entity_type]
    if c.match_type == MATCH_EXACT:
        return value == c.match
    if c.match_type == MATCH_DEFAULT:
        return value is None
    return value is not None        # MATCH_ANY: any specified name, not the default


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ connection limits

def parse_per_ip_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides`: `host:count` entries separated by commas."""
    out: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ValueError(f"max.connections.per.ip.overrides: {item!r} is not host:count")
        out[host.strip().strip("[]")] = int(count)
    return out
