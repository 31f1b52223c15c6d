"""Kafka's ConnectionQuotas (kafka/network/SocketServer.scala; KIP-402, KIP-612), the clock passed
in: how many connections a broker, a listener and an address may hold, and how fast they may
open them.

The acceptor asks, for each connection it has accepted, in Kafka's order:

1. `record_connection(listener, now_ms)`: the connection is counted in the broker-wide and the
   listener's creation rate (`max.connection.creation.rate`, `listener.name.<l>.` overrides it);
   the answer is how long the acceptor must wait before going on (0 within the rates).
2. `slot_available(listener)`: the listener holds fewer than its `max.connections` and, except on
   the protected listener, the broker fewer than `max.connections`. The acceptor waits (accepting
   nothing else: new connections queue in the kernel's backlog) until both hold.
3. `admit(listener, ip, now_ms)`: the address's `connection_creation_rate` quota (an `ip` client
   quota, or the default `ip` entity's; KIP-612) and `max.connections.per.ip` (with
   `max.connections.per.ip.overrides`). Over the rate the connection is not counted anywhere and
   is closed after the throttle time (`Refusal.delay_ms`), so a client that reconnects at once
   cannot hammer the broker; over the count it is closed at once.

`release` undoes an admitted connection. The protected listener is `inter.broker.listener.name`
when there is more than one listener: brokers reach each other even when clients hold every
slot; if that takes the broker over `max.connections`, `excess()` says so and the broker closes
the least recently active connection of another listener.

Rates are Kafka's `Rate` over `quota.window.num` samples of `quota.window.size.seconds`; a
throttle is `(rate - quota) / quota * window`, at most one window (`QuotaUtils.boundedThrottleTime`).
So with a rate of 2 a burst of 20 connections fits (20 over the 10 whole windows the rate is
measured over at least), the 21st is throttled.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from oncelog.core.security.quotas import INACTIVE_SENSOR_EXPIRATION_MS, Rate, throttle_time_ms

UNLIMITED = 2**31 - 1          # Kafka's defaults: Int.MaxValue means no limit


def canonical_ip(address: str) -> str:
    """One spelling per address (`0:0:0:0:0:0:0:1` and `::1` alike, an IPv4-mapped IPv6 address as
    IPv4), as Kafka compares InetAddresses; a name that is no address is kept as given."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


@dataclass(frozen=True)
class Refusal:
    reason: str
    delay_ms: int = 0           # > 0: close after this long (a throttled address), else at once


@dataclass
class _Listener:
    max_connections: int
    max_creation_rate: int
    rate: Rate
    count: int = 0


@dataclass
class _IpSensor:
    rate: Rate
    last_ms: int


@dataclass
class ConnectionQuotas:
    max_connections: int = UNLIMITED
    max_per_ip: int = UNLIMITED
    per_ip_overrides: dict[str, int] = field(default_factory=dict)    # canonical address -> count
    max_creation_rate: int = UNLIMITED
    samples: int = 11
    window_ms: int = 1000
    protected_listener: str = ""
    # canonical address (or None for the default `ip` entity) -> connection_creation_rate
    ip_rates: dict[str | None, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.total = 0
        self._listeners: dict[str, _Listener] = {}
        self._per_ip: dict[str, int] = {}
        self._broker_rate = Rate(self.samples, self.window_ms)
        self._ip_sensors: dict[str, _IpSensor] = {}
        self.per_ip_overrides = {canonical_ip(k): v for k, v in self.per_ip_overrides.items()}

    # ------------------------------------------------------------------ settings
    def set_listener(self, name: str, max_connections: int = UNLIMITED, max_creation_rate: int = UNLIMITED) -> None:
        """Add a listener, or change its limits (a dynamic config change)."""
        current = self._listeners.get(name)
        if current is None:
            self._listeners[name] = _Listener(max_connections, max_creation_rate, Rate(self.samples, self.window_ms))
        else:
            current.max_connections, current.max_creation_rate = max_connections, max_creation_rate

    def set_per_ip_overrides(self, overrides: Mapping[str, int]) -> None:
        self.per_ip_overrides = {canonical_ip(k): v for k, v in overrides.items()}

    def set_ip_rates(self, rates: Mapping[str | None, float]) -> None:
        """The `connection_creation_rate` of each `ip` quota entity (None: the default entity)."""
        self.ip_rates = {(None if ip is None else canonical_ip(ip)): int(rate) for ip, rate in rates.items()}

    def is_protected(self, listener: str) -> bool:
        """The inter-broker listener, beside at least one other: not held by `max.connections`."""
        return listener == self.protected_listener and len(self._listeners) > 1

    # ------------------------------------------------------------------ the acceptor's steps
    def record_connection(self, listener: str, now_ms: int) -> int:
        """Kafka's recordConnectionAndGetThrottleTimeMs: the wait the broker-wide and the listener's
        creation rates impose (the longer; the broker-wide one does not apply to the protected
        listener)."""
        wait = 0
        if not self.is_protected(listener):
            wait = self._record(self._broker_rate, self.max_creation_rate, now_ms)
        quota = self._listeners[listener]
        return max(wait, self._record(quota.rate, quota.max_creation_rate, now_ms))

    def slot_available(self, listener: str) -> bool:
        quota = self._listeners[listener]
        if quota.count >= quota.max_connections:
            return False
        return self.is_protected(listener) or self.total < self.max_connections

    def admit(self, listener: str, ip: str, now_ms: int) -> Refusal | None:
        """None: the connection is counted (release it when it closes). Else why it is refused."""
        ip = canonical_ip(ip)
        rate_quota = self.ip_rates.get(ip, self.ip_rates.get(None, UNLIMITED))
        if rate_quota != UNLIMITED:
            sensor = self._ip_sensors.get(ip)
            if sensor is None:
                sensor = self._ip_sensors[ip] = _IpSensor(Rate(self.samples, self.window_ms), now_ms)
            sensor.last_ms = now_ms
            wait = self._record(sensor.rate, rate_quota, now_ms)
            if wait > 0:
                # not accepted: counted nowhere (Kafka's updateListenerMetrics)
                sensor.rate.record(-1.0, now_ms)
                if not self.is_protected(listener):
                    self._broker_rate.record(-1.0, now_ms)
                self._listeners[listener].rate.record(-1.0, now_ms)
                return Refusal(f"connection creation rate of {ip} over its quota of {rate_quota}/s "
                               "(connection_creation_rate)", wait)
        limit = self.per_ip_overrides.get(ip, self.max_per_ip)
        count = self._per_ip.get(ip, 0)
        if count >= limit:
            return Refusal(f"Too many connections from {ip} (maximum = {limit})")
        self._per_ip[ip] = count + 1
        self.total += 1
        self._listeners[listener].count += 1
        return None

    def release(self, listener: str, ip: str) -> None:
        ip = canonical_ip(ip)
        count = self._per_ip.get(ip, 0)
        if count <= 1:
            self._per_ip.pop(ip, None)
        else:
            self._per_ip[ip] = count - 1
        self.total = max(0, self.total - 1)
        quota = self._listeners.get(listener)
        if quota is not None:
            quota.count = max(0, quota.count - 1)

    def excess(self) -> bool:
        """Kafka's maxConnectionsExceeded: only the protected listener can take the broker over
        `max.connections`; connections of the other listeners then make room."""
        return self.total > self.max_connections

    def count(self, listener: str | None = None, ip: str | None = None) -> int:
        if ip is not None:
            return self._per_ip.get(canonical_ip(ip), 0)
        return self.total if listener is None else self._listeners[listener].count

    def expire(self, now_ms: int) -> int:
        """Forget addresses that opened no connection for an hour (Kafka expires their sensors)."""
        old = [ip for ip, s in self._ip_sensors.items() if now_ms - s.last_ms >= INACTIVE_SENSOR_EXPIRATION_MS]
        for ip in old:
            del self._ip_sensors[ip]
        return len(old)

    def _record(self, rate: Rate, quota: int, now_ms: int) -> int:
        """Kafka's recordAndGetThrottleTimeMs: record one connection; over the quota, the bounded
        throttle time."""
        rate.record(1.0, now_ms)
        if quota >= UNLIMITED:
            return 0
        observed = rate.measure(now_ms)
        if observed <= quota:
            return 0
        return min(throttle_time_ms(observed, quota, rate.window_size_ms(now_ms)), self.window_ms)
