"""ACLs and SCRAM users as the admin client manages them (kafka-acls' and kafka-configs'
requests): DescribeAcls, CreateAcls and DeleteAcls with Kafka's bindings and filters
(`core.security.acl`); DescribeUserScramCredentials and AlterUserScramCredentials, the salted
password computed here so that the password itself never crosses the wire (KIP-554)."""
from __future__ import annotations

import secrets

from oncelog.client.aio.admin_base import AdminError, ask, ask_controller
from oncelog.client.aio.cluster import Cluster
from oncelog.client.errors import KafkaClientError
from oncelog.core.security.acl import (
    ANY_FILTER,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    from_code,
)
from oncelog.core.security.scram import DEFAULT_ITERATIONS, ScramMechanism, salted_password
from oncelog.protocol.api import ApiKey


def _filter_fields(f: AclBindingFilter) -> dict:
    p, e = f.pattern, f.entry
    return dict(resource_type_filter=int(p.resource_type), resource_name_filter=p.name,
                pattern_type_filter=int(p.pattern_type), principal_filter=e.principal, host_filter=e.host,
                operation=int(e.operation), permission_type=int(e.permission_type))


def _binding(resource_type, name, pattern_type, principal, host, operation, permission) -> AclBinding:
    return AclBinding(ResourcePattern(from_code(ResourceType, int(resource_type)), str(name),
                                      from_code(PatternType, int(pattern_type))),
                      AccessControlEntry(str(principal), str(host), from_code(AclOperation, int(operation)),
                                         from_code(AclPermissionType, int(permission))))


class SecurityAdmin:
    """The admin client's ACL and SCRAM methods (mixed into AIOAdminClient)."""

    cluster: Cluster

    async def describe_acls(self, f: AclBindingFilter = ANY_FILTER) -> list[AclBinding]:
        r = await ask_controller(self.cluster, ApiKey.DESCRIBE_ACLS, lambda rq: rq.encode(**_filter_fields(f)))
        if r.error_code:
            raise AdminError(r.error_code, "describe ACLs", r.error_message)
        return [_binding(res.resource_type, res.resource_name, res.pattern_type, a.principal, a.host, a.operation,
                         a.permission_type)
                for res in r.resources for a in res.acls]

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        def build(rq):
            return rq.encode(creations=tuple(
                rq("AclCreation", resource_type=int(b.pattern.resource_type), resource_name=b.pattern.name,
                   resource_pattern_type=int(b.pattern.pattern_type), principal=b.entry.principal,
                   host=b.entry.host, operation=int(b.entry.operation),
                   permission_type=int(b.entry.permission_type))
                for b in bindings))
        r = await ask_controller(self.cluster, ApiKey.CREATE_ACLS, build)
        for b, result in zip(bindings, r.results):
            if result.error_code:
                raise AdminError(result.error_code, f"create ACL {b}", result.error_message)

    async def delete_acls(self, filters: list[AclBindingFilter]) -> list[AclBinding]:
        """The bindings deleted."""
        r = await ask_controller(self.cluster, ApiKey.DELETE_ACLS, lambda rq: rq.encode(filters=tuple(
            rq("DeleteAclsFilter", **_filter_fields(f)) for f in filters)))
        out = []
        for fr in r.filter_results:
            if fr.error_code:
                raise AdminError(fr.error_code, "delete ACLs", fr.error_message)
            for m in fr.matching_acls:
                if m.error_code:
                    raise AdminError(m.error_code, "delete ACLs", m.error_message)
                out.append(_binding(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host,
                                    m.operation, m.permission_type))
        return out

    async def describe_scram_users(self, users: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
        """user -> [(mechanism, iterations)]; None: every user with a credential."""
        r = await ask_controller(self.cluster, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, lambda rq: rq.encode(
            users=None if users is None else tuple(rq("UserName", name=u) for u in users)))
        if r.error_code:
            raise AdminError(r.error_code, "describe SCRAM users", r.error_message)
        out = {}
        for res in r.results:
            if res.error_code:
                raise AdminError(res.error_code, f"describe SCRAM user {res.user}", res.error_message)
            out[str(res.user)] = [(_mechanism(int(c.mechanism)), int(c.iterations)) for c in res.credential_infos]
        return out

    async def upsert_scram_user(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256",
                                iterations: int = DEFAULT_ITERATIONS) -> None:
        mech = ScramMechanism.from_name(mechanism)
        if mech is None:
            raise KafkaClientError(f"unknown SCRAM mechanism {mechanism} (SCRAM-SHA-256 or SCRAM-SHA-512)")
        salt = secrets.token_bytes(32)
        salted = salted_password(mech, password, salt, iterations)
        await self._alter_scram(user, lambda rq: rq.encode(deletions=(), upsertions=(
            rq("ScramCredentialUpsertion", name=user, mechanism=mech.type, iterations=iterations, salt=salt,
               salted_password=salted),)))

    async def delete_scram_user(self, user: str, mechanism: str = "SCRAM-SHA-256") -> None:
        mech = ScramMechanism.from_name(mechanism)
        if mech is None:
            raise KafkaClientError(f"unknown SCRAM mechanism {mechanism} (SCRAM-SHA-256 or SCRAM-SHA-512)")
        await self._alter_scram(user, lambda rq: rq.encode(upsertions=(), deletions=(
            rq("ScramCredentialDeletion", name=user, mechanism=mech.type),)))

    async def _alter_scram(self, user: str, build) -> None:
        r = await ask_controller(self.cluster, ApiKey.ALTER_USER_SCRAM_CREDENTIALS, build)
        for res in r.results:
            if res.error_code:
                raise AdminError(res.error_code, f"alter SCRAM user {res.user}", res.error_message)


def _mechanism(type_: int) -> str:
    m = ScramMechanism.from_type(type_)
    return m.mechanism_name if m is not None else f"UNKNOWN({type_})"


QUOTA_ENTITY_TYPES = ("user", "client-id", "ip")


class QuotaAdmin:
    """Client quotas (KIP-546's DescribeClientQuotas and AlterClientQuotas), as
    `kafka-configs --entity-type users|clients|ips` and `rpk cluster quotas` use them. An entity is
    {type: name} with `user`, `client-id`, `ip`; a name None is that type's default."""

    cluster: Cluster

    async def describe_client_quotas(self, exact: dict[str, str | None] | None = None,
                                     strict: bool = False) -> list[dict]:
        """Quotas of entities matching `exact` ({type: name, or None for the default entity};
        empty: every entity): [{"entity": {type: name}, "values": {key: value}}]."""
        components = exact or {}
        conn = await self.cluster.any_connection()
        _, r = await ask(conn, ApiKey.DESCRIBE_CLIENT_QUOTAS, lambda rq: rq.encode(strict=strict, components=tuple(
            rq("ComponentData", entity_type=t, match_type=0 if n is not None else 1, match=n)
            for t, n in components.items())), self.cluster.timeout_s)
        if r.error_code:
            raise AdminError(r.error_code, "describe client quotas", r.error_message)
        return [{"entity": {str(e.entity_type): e.entity_name for e in entry.entity},
                 "values": {str(v.key): float(v.value) for v in entry.values}} for entry in (r.entries or ())]

    async def alter_client_quotas(self, entity: dict[str, str | None], add: dict[str, float],
                                  remove: list[str]) -> None:
        """Set `add` and remove `remove` (quota keys: producer_byte_rate, consumer_byte_rate,
        request_percentage, controller_mutation_rate, connection_creation_rate) for `entity`."""
        ops = [(k, v, False) for k, v in add.items()] + [(k, 0.0, True) for k in remove]
        r = await ask_controller(self.cluster, ApiKey.ALTER_CLIENT_QUOTAS, lambda rq: rq.encode(
            validate_only=False, entries=(rq("EntryData", entity=tuple(
                rq("EntityData", entity_type=t, entity_name=n) for t, n in entity.items()), ops=tuple(
                rq("OpData", key=k, value=v, remove=rm) for k, v, rm in ops)),)))
        for e in r.entries:
            if e.error_code:
                raise AdminError(e.error_code, "alter client quotas", e.error_message)
