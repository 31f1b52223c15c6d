"""The single-node default: a controller in the broker's process, reached over loopback through
the same SASL-authenticated request path a separate controller uses (`oncelog serve` without
`controller.quorum.bootstrap.servers`; in-process brokers in tests do the same), with the data
directory's cluster credential (`storage.cluster_credential`, made at the first start).

KIP-730's upgrade rule: before the controller, a single node reserved producer ids in a file of
its data directory (`producer-id-block`); the controller starts strictly above the highest id
reserved there, so no id is ever issued twice.
"""
from __future__ import annotations

from pathlib import Path

from oncelog.controller.connection_limits import ConnectionLimits
from oncelog.controller.service import Controller, ControllerConfig
from oncelog.storage import cluster_credential

LEGACY_PRODUCER_ID_FILE = "producer-id-block"


def legacy_producer_id_floor(data_dir: str | Path) -> int:
    """The highest producer id the file allocator of older versions reserved in `data_dir`
    (0 if it never ran there)."""
    try:
        return int((Path(data_dir) / LEGACY_PRODUCER_ID_FILE).read_text().strip())
    except FileNotFoundError:
        return 0


async def start_in_process(data_dir: str | Path, bootstrap_scram: list | None = None, *, host: str = "127.0.0.1",
                           port: int = 0, limits: ConnectionLimits | None = None) -> tuple[Controller, dict[str, str]]:
    """A started controller whose metadata lives in `data_dir/__cluster_metadata`, listening on
    host:port (`controller.listener`; port 0: a free one), and the broker settings that reach it
    (`controller.quorum.bootstrap.servers` and its credentials). `limits`: the broker's own
    (`ConnectionLimits.from_settings(config.get)`), else Kafka's defaults."""
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    credential = cluster_credential.load_or_create(cluster_credential.path_in(data))
    controller = Controller(ControllerConfig(str(data / "__cluster_metadata"), host, port,
                                             users={credential.username: credential.password},
                                             cluster_principals={credential.username},
                                             producer_id_floor=legacy_producer_id_floor(data),
                                             bootstrap_scram=list(bootstrap_scram or ()),
                                             limits=limits or ConnectionLimits()))
    host, port = await controller.start()
    return controller, {"controller.quorum.bootstrap.servers": f"{host}:{port}",
                        "controller.sasl.plain.username": credential.username,
                        "controller.sasl.plain.password": credential.password}
