"""The rights each served API needs, one declaration per API key and version range (Kafka's
`AuthorizerIntegrationTest.requestKeysToAcls`, issue 36): the table tests are generated from
(tests/security/test_api_rights.py) and that fails when an API or version is served without an
entry. Pure data; the handlers enforce it (`broker.security.authorization`), the tests hold them
to it.

A `Right` is an operation on a resource named by the request: `TOPIC` the topics it names, `GROUP`
its group, `TXN` its transactional id, `CLUSTER` the cluster. An entry needs every right of
`all_of`, and one of each alternative group of `any_of`. `filtered`: a listing that leaves out
what the caller may not see, refusing nothing; `broker_only`: the broker principal alone (§1.1 of
docs/security.md), no ACL stands in; `open`: nothing needed. What filters a listing (this entry's
or any other answer naming resources the request did not name) is declared in `LISTINGS`.

`pre_auth`: served on a SASL listener before the connection is authenticated, in the order of
`PRE_AUTH_ORDER` (Kafka's SaslServerAuthenticator: ApiVersions, then SaslHandshake, then
SaslAuthenticate); every other request before that closes the connection unanswered (or, between
the handshake and the token, answered ILLEGAL_SASL_STATE first), so it needs no right because it
is never served to anyone not yet known. After authentication SaslHandshake and SaslAuthenticate
are answered ILLEGAL_SASL_STATE (no re-authentication asked), needing no right and granting
nothing. tests/security/test_api_rights.py generates both checks from these entries."""
from __future__ import annotations

from dataclasses import dataclass

from oncelog.core.security.acl import AclOperation as Op
from oncelog.core.security.acl import ResourceType
from oncelog.protocol.api import ApiKey as K

TOPIC, GROUP, TXN, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER


@dataclass(frozen=True)
class Right:
    operation: Op
    resource: ResourceType


@dataclass(frozen=True)
class ApiRights:
    versions: tuple[int, int]
    all_of: tuple[Right, ...] = ()
    any_of: tuple[tuple[Right, ...], ...] = ()
    filtered: bool = False
    broker_only: bool = False
    open: bool = False
    pre_auth: bool = False
    note: str = ""


def _r(op: Op, resource: ResourceType) -> Right:
    return Right(op, resource)


RT, WT, DT, AT = _r(Op.READ, TOPIC), _r(Op.WRITE, TOPIC), _r(Op.DESCRIBE, TOPIC), _r(Op.ALTER, TOPIC)
RG, DG, XG = _r(Op.READ, GROUP), _r(Op.DESCRIBE, GROUP), _r(Op.DELETE, GROUP)
WX, DX = _r(Op.WRITE, TXN), _r(Op.DESCRIBE, TXN)
AC, DC = _r(Op.ALTER, CLUSTER), _r(Op.DESCRIBE, CLUSTER)

API_RIGHTS: dict[int, tuple[ApiRights, ...]] = {
    K.PRODUCE: (ApiRights((0, 14), (WT,), note="transactional: also WRITE X"),),
    K.FETCH: (ApiRights((4, 12), (RT,)),),
    K.LIST_OFFSETS: (ApiRights((1, 10), (DT,)),),
    K.METADATA: (ApiRights((0, 12), (DT,), note="named topics; all topics: filtered; auto-creation: CREATE"),),
    K.OFFSET_COMMIT: (ApiRights((2, 9), (RG, RT)),),
    K.OFFSET_FETCH: (ApiRights((1, 9), (DG, DT)),),
    K.FIND_COORDINATOR: (ApiRights((0, 4), any_of=((DG, DX),), note="DESCRIBE on the key's type"),),
    K.JOIN_GROUP: (ApiRights((0, 7), (RG,)),),
    K.HEARTBEAT: (ApiRights((0, 4), (RG,)),),
    K.LEAVE_GROUP: (ApiRights((0, 4), (RG,)),),
    K.SYNC_GROUP: (ApiRights((0, 5), (RG,)),),
    K.DESCRIBE_GROUPS: (ApiRights((0, 5), (DG,)),),
    K.LIST_GROUPS: (ApiRights((0, 5), filtered=True, note="DESCRIBE C: all; else by DESCRIBE G"),),
    K.SASL_HANDSHAKE: (ApiRights((0, 1), open=True, pre_auth=True, note="the login itself"),),
    K.API_VERSIONS: (ApiRights((0, 4), open=True, pre_auth=True, note="the versions the login may use"),),
    K.CREATE_TOPICS: (ApiRights((2, 7), any_of=((_r(Op.CREATE, CLUSTER), _r(Op.CREATE, TOPIC)),)),),
    K.DELETE_TOPICS: (ApiRights((1, 6), (_r(Op.DELETE, TOPIC),)),),
    K.DELETE_RECORDS: (ApiRights((0, 2), (_r(Op.DELETE, TOPIC),)),),
    # v1-v2 have no error code: without the right, an empty list (Kafka's answer too)
    K.DESCRIBE_LOG_DIRS: (ApiRights((1, 2), filtered=True, note="DESCRIBE C; else an empty list"),
                          ApiRights((3, 4), (DC,))),
    K.INIT_PRODUCER_ID: (ApiRights((0, 6), any_of=((_r(Op.IDEMPOTENT_WRITE, CLUSTER), WT),),
                                   note="transactional: WRITE X instead; v6 with Enable2Pc: also "
                                        "TWO_PHASE_COMMIT X (KIP-939)"),),
    K.ADD_PARTITIONS_TO_TXN: (ApiRights((0, 3), (WX, WT)), ApiRights((4, 5), broker_only=True)),
    K.ADD_OFFSETS_TO_TXN: (ApiRights((0, 3), (WX, RG)),),
    K.END_TXN: (ApiRights((0, 5), (WX,)),),
    K.WRITE_TXN_MARKERS: (ApiRights((1, 2), broker_only=True),),
    K.TXN_OFFSET_COMMIT: (ApiRights((0, 5), (WX, RG, RT)),),
    K.DESCRIBE_ACLS: (ApiRights((1, 3), (DC,)),),
    K.CREATE_ACLS: (ApiRights((1, 3), (AC,)),),
    K.DELETE_ACLS: (ApiRights((1, 3), (AC,)),),
    K.DESCRIBE_CONFIGS: (ApiRights((1, 4), (_r(Op.DESCRIBE_CONFIGS, TOPIC),),
                                   note="BROKER resources: on the cluster; GROUP: on the group"),),
    K.ALTER_CONFIGS: (ApiRights((0, 2), (_r(Op.ALTER_CONFIGS, TOPIC),)),),
    K.SASL_AUTHENTICATE: (ApiRights((0, 2), open=True, pre_auth=True, note="the login itself"),),
    K.CREATE_PARTITIONS: (ApiRights((0, 3), (AT,)),),
    K.DELETE_GROUPS: (ApiRights((0, 2), (XG,)),),
    K.INCREMENTAL_ALTER_CONFIGS: (ApiRights((0, 1), (_r(Op.ALTER_CONFIGS, TOPIC),)),),
    K.OFFSET_DELETE: (ApiRights((0, 0), (XG, RT)),),
    K.DESCRIBE_CLIENT_QUOTAS: (ApiRights((0, 1), (_r(Op.DESCRIBE_CONFIGS, CLUSTER),)),),
    K.ALTER_CLIENT_QUOTAS: (ApiRights((0, 1), (_r(Op.ALTER_CONFIGS, CLUSTER),)),),
    K.DESCRIBE_USER_SCRAM_CREDENTIALS: (ApiRights((0, 0), (DC,)),),
    K.ALTER_USER_SCRAM_CREDENTIALS: (ApiRights((0, 0), (AC,)),),
    K.UPDATE_FEATURES: (ApiRights((0, 2), (AC,)),),
    K.DESCRIBE_CLUSTER: (ApiRights((0, 1), open=True, note="authorized operations only with DESCRIBE C"),),
    K.DESCRIBE_PRODUCERS: (ApiRights((0, 0), (RT,)),),
    K.DESCRIBE_TRANSACTIONS: (ApiRights((0, 0), (DX,), note="partitions filtered by DESCRIBE T"),),
    K.LIST_TRANSACTIONS: (ApiRights((0, 1), filtered=True, note="by DESCRIBE X"),),
    K.CONSUMER_GROUP_HEARTBEAT: (ApiRights((0, 1), (RG, DT), note="regex matches filtered by DESCRIBE T"),),
    K.CONSUMER_GROUP_DESCRIBE: (ApiRights((0, 1), (DG,), note="and DESCRIBE T of every topic of the group"),),
    # share groups (KIP-932): topics of ShareFetch/ShareAcknowledge are named by id
    K.SHARE_GROUP_HEARTBEAT: (ApiRights((1, 1), (RG, DT)),),
    K.SHARE_GROUP_DESCRIBE: (ApiRights((1, 1), (DG,), note="and DESCRIBE T of every topic of the group"),),
    K.SHARE_FETCH: (ApiRights((1, 2), (RG, RT)),),
    K.SHARE_ACKNOWLEDGE: (ApiRights((1, 2), (RG, RT)),),
    # Kafka's KafkaApis: Describe DESCRIBE G and T, Alter READ G and T, Delete DELETE G and READ T
    K.DESCRIBE_SHARE_GROUP_OFFSETS: (ApiRights((0, 1), (DG, DT), note="topics null: filtered by DESCRIBE T"),),
    K.ALTER_SHARE_GROUP_OFFSETS: (ApiRights((0, 0), (RG, RT)),),
    K.DELETE_SHARE_GROUP_OFFSETS: (ApiRights((0, 0), (XG, RT)),),
}


# the APIs served before authentication, in the order a login sends them
PRE_AUTH_ORDER = (K.API_VERSIONS, K.SASL_HANDSHAKE, K.SASL_AUTHENTICATE)


@dataclass(frozen=True)
class Listing:
    """An answer that names resources the request did not name one by one: every topic (Metadata,
    DescribeLogDirs and OffsetFetch with topics null), every group or transactional id (ListGroups,
    ListTransactions), what a regex matches (ConsumerGroupHeartbeat), what a named group or
    transaction holds (ConsumerGroupDescribe, ShareGroupDescribe, DescribeTransactions). Kafka
    filters such answers instead of refusing them: a resource of type `lists` appears only for a
    caller with `shown_by` on it (a right on the CLUSTER: on the cluster, for all of them), or with
    `all_by` on the cluster. `reach`: the rights on what the request names that it needs to be
    answered at all. `whole`: the answer (or the named resource holding one the caller may not
    see) is refused whole, with the authorization error of `shown_by`'s resource type (Kafka 4's
    ConsumerGroupDescribe rule; DescribeLogDirs v3+), instead of being answered without it.
    `asks`: how the request asks for the listing."""
    versions: tuple[int, int]
    lists: ResourceType
    shown_by: Right
    asks: str
    reach: tuple[Right, ...] = ()
    all_by: Right | None = None
    whole: bool = False
    note: str = ""


# Checked by tests/security/test_api_rights.py (a listing an API's schema allows but that is
# declared nowhere fails it) and answered by the generated listing test there.
LISTINGS: dict[int, tuple[Listing, ...]] = {
    K.METADATA: (Listing((0, 12), TOPIC, DT, "topics null (v0: empty)"),),
    K.OFFSET_FETCH: (Listing((2, 9), TOPIC, DT, "topics null", reach=(DG,)),),
    K.LIST_GROUPS: (Listing((0, 5), GROUP, DG, "every group", all_by=DC),),
    # the version's top-level error decides: v1-2 have none (an empty list), v3-4 refuse
    K.DESCRIBE_LOG_DIRS: (Listing((1, 2), TOPIC, DC, "topics null"),
                          Listing((3, 4), TOPIC, DC, "topics null", whole=True)),
    K.DESCRIBE_TRANSACTIONS: (Listing((0, 0), TOPIC, DT, "the transaction's partitions", reach=(DX,)),),
    K.LIST_TRANSACTIONS: (Listing((0, 1), TXN, DX, "every transactional id",
                                  note="DESCRIBE C shows nothing more, as in Kafka"),),
    K.CONSUMER_GROUP_HEARTBEAT: (Listing((1, 1), TOPIC, DT, "a regex subscription", reach=(RG,)),),
    K.CONSUMER_GROUP_DESCRIBE: (Listing((0, 1), TOPIC, DT, "the group's topics", reach=(DG,), whole=True),),
    K.SHARE_GROUP_DESCRIBE: (Listing((1, 1), TOPIC, DT, "the group's topics", reach=(DG,), whole=True),),
    K.DESCRIBE_SHARE_GROUP_OFFSETS: (Listing((0, 1), TOPIC, DT, "topics null", reach=(DG,)),),
}


def listing_for(api_key: int, version: int) -> Listing | None:
    for entry in LISTINGS.get(api_key, ()):
        if entry.versions[0] <= version <= entry.versions[1]:
            return entry
    return None


def rights_for(api_key: int, version: int) -> ApiRights | None:
    for entry in API_RIGHTS.get(api_key, ()):
        if entry.versions[0] <= version <= entry.versions[1]:
            return entry
    return None
