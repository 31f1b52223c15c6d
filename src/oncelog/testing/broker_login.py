"""A connection to a broker as another broker of its cluster would open it: logged in with the
cluster credential of the data directory (`storage.cluster_credential`), so that the broker-only
requests (WriteTxnMarkers, AddPartitionsToTxn v4) are served. For tests that play the other
broker's part by hand."""
from __future__ import annotations

import ssl
from pathlib import Path

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.storage import cluster_credential


def as_broker(address: str, data_dir: str | Path, mechanism: str = "SCRAM-SHA-512",
              tls: ssl.SSLContext | None = None) -> ControllerClient:
    """A client of the broker at `address` ("host:port") that authenticates on its first request;
    SCRAM-SHA-512 works on every listener (on those without SASL, as the cluster login)."""
    credential = cluster_credential.load(cluster_credential.path_in(data_dir))
    host, _, port = address.rpartition(":")
    return ControllerClient(host, int(port), credential.username, credential.password, client_id="test-broker",
                            ssl_context=tls, mechanism=mechanism)
