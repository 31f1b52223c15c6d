"""What a request handler sees of its broker: the services it may use, typed.

Every handler is `async def handle(broker: BrokerServices, version, request)`. `net.server.Broker`
implements this structurally (mypy checks it where the dispatch is built), and so does anything a
test hands a handler instead. Naming the services here, rather than handing handlers an untyped
broker, is what lets mypy check the handlers and lets a reader (or a call-graph walk) follow a
request from its handler into the group coordinator, the transaction coordinator or a
`storage.partition.Partition` (through `logs`).

The services `Broker.start` makes (groups and their ownership, transactions, producer ids, the security follower, the
controller credentials) are read as properties that raise `BrokerNotStarted` before it made them;
handlers run only once it has.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from oncelog.broker.cluster.producer_id_manager import ProducerIdManager
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.dynamic_config import DynamicBrokerConfig
    from oncelog.broker.groups.coordinator import GroupCoordinator
    from oncelog.broker.groups.ownership import GroupOwnership
    from oncelog.broker.logs.fsync_batcher import GroupCommit
    from oncelog.broker.logs.seam import Logs
    from oncelog.broker.metrics import BrokerMetrics
    from oncelog.broker.security.follower import SecurityFollower
    from oncelog.broker.security.quotas import BrokerQuotas
    from oncelog.broker.security.scram_credentials import ControllerCredentials
    from oncelog.broker.txn.add_partitions import TxnCheck
    from oncelog.broker.txn.coordinator import TxnCoordinatorService
    from oncelog.core.security.authorizer import Authorizer
    from oncelog.storage.disk_space import DiskSpace

class BrokerNotStarted(RuntimeError):
    """A service `Broker.start` makes was asked for before it made it."""


class BrokerServices(Protocol):
    config: BrokerConfig
    node_id: int
    cluster_id: str
    logs: Logs                      # the partitions this broker leads, and topic changes
    authorizer: Authorizer | None   # None: authorization disabled (`authorizer.class.name` empty)
    quotas: BrokerQuotas
    metrics: BrokerMetrics
    group_commit: GroupCommit       # acks=all answers wait for their fsync here
    dynamic_config: DynamicBrokerConfig
    disk_space: DiskSpace           # free space of log.dirs, and the reserve Produce may not use
    txn_check: TxnCheck | None      # None: transactional batches are appended as they come
    txn_verification: bool          # transaction.partition.verification.enable (Transactions V1)

    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def group_ownership(self) -> GroupOwnership:
        """Which broker coordinates a group: the leader of its `__consumer_offsets` partition."""
    @property
    def txn(self) -> TxnCoordinatorService: ...
    @property
    def producer_ids(self) -> ProducerIdManager: ...
    @property
    def security(self) -> SecurityFollower: ...
    @property
    def credentials(self) -> ControllerCredentials: ...
    @property
    def advertised_host(self) -> str:
        """The address of the listener the request came in on (Kafka answers per listener)."""
    @property
    def advertised_port(self) -> int: ...

    def now_ms(self) -> int: ...
    def coordinates(self, group_id: str) -> bool:
        """Whether this broker coordinates `group_id`."""
    def group_coordinator(self, group_id: str) -> tuple[int, str, int] | None:
        """(node id, host, port) of the broker coordinating `group_id`; None while its
        `__consumer_offsets` partition has no leader."""
    def data_appended(self) -> None:
        """Wake long-polling fetches."""
    async def wait_for_data(self, timeout_s: float) -> None: ...
