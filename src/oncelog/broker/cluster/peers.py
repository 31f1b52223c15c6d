"""Connections from this broker to the other brokers of its cluster (WriteTxnMarkers from the
transaction coordinator to partition leaders, AddPartitionsToTxn VerifyOnly from a partition
leader to the coordinator).

Addresses come from the broker's metadata view (`broker.logs.brokers`, the controller's list of
live brokers), so a restarted or moved peer is reached at its current address: a connection is
replaced when its peer's address changes. The wire work is `ControllerClient`'s (framing,
correlation ids, a deadline per request, one request at a time per connection); the link is
secured as `broker.security.inter_broker` says (TLS as the inter-broker listener needs, SASL with the
cluster credential), so the peer serves its broker-only requests. Each user (marker channel,
verifier) holds its own `Peers`, so markers never queue behind verifications or the other way
round.
"""
from __future__ import annotations

from typing import Any

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable, client_idle_ms
from oncelog.protocol.errors import KafkaProtocolError


class PeerUnavailable(ConnectionError):
    """The peer is not in the metadata view, or could not be reached, or dropped the connection."""


class Peers:
    def __init__(self, broker, client_id: str, timeout_s: float = 5.0) -> None:
        self.broker = broker
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._clients: dict[int, ControllerClient] = {}

    def address(self, node_id: int) -> tuple[str, int] | None:
        for b in self.broker.logs.brokers:
            if b.node_id == node_id:
                return b.host, b.port
        return None

    def _client(self, node_id: int) -> ControllerClient:
        address = self.address(node_id)
        if address is None:
            raise PeerUnavailable(f"broker {node_id} is not in this broker's metadata view")
        client = self._clients.get(node_id)
        if client is not None and (client.host, client.port) != address:
            client.close()
            client = None
        if client is None:
            link = self.broker.inter_broker
            client = self._clients[node_id] = ControllerClient(
                address[0], address[1], link.credential.username, link.credential.password,
                client_id=self.client_id, timeout_s=self.timeout_s, ssl_context=link.tls, mechanism=link.mechanism,
                server_name=f"broker {node_id}",
                max_idle_ms=client_idle_ms(self.broker.config["connections.max.idle.ms"]))
        return client

    async def request(self, node_id: int, api_key: int, version: int, **fields: Any):
        """One request to broker `node_id`; its decoded response. PeerUnavailable when the peer
        cannot answer (the caller retries, after re-resolving whom to ask)."""
        client = self._client(node_id)
        try:
            return await client.request(api_key, version, **fields)
        except ControllerUnavailable as e:
            raise PeerUnavailable(str(e)) from None
        except (TimeoutError, OSError) as e:
            raise PeerUnavailable(f"broker {node_id} at {client.host}:{client.port}: {e}") from None
        except KafkaProtocolError as e:   # the peer refused the login: another cluster's credential?
            raise PeerUnavailable(f"broker {node_id} refused this broker's cluster credential: {e}") from None

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
