"""DescribeConfigs of a GROUP resource (a share group's configs, KIP-932 and KIP-1191's dead-letter
topic) needs DESCRIBE_CONFIGS on the group, as Kafka's ConfigHelper asks: without it the answer is
GROUP_AUTHORIZATION_FAILED and names nothing of the group's configs."""
from __future__ import annotations

import pytest
from tests.security.rights_support import GROUP_NAME, secured_broker

from oncelog.core.security.acl import AclOperation as Op
from oncelog.core.security.acl import ResourceType
from oncelog.core.security.api_rights import Right
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E

pytestmark = pytest.mark.asyncio


async def test_a_groups_configs_are_described_only_with_describe_configs_on_the_group(tmp_path):
    async with secured_broker(tmp_path / "data") as s:
        alice = await s.login("alice")
        res = entities.nested(ApiKey.DESCRIBE_CONFIGS, 4, "request", "DescribeConfigsResource")

        async def describe(conn):
            r = await conn.call(ApiKey.DESCRIBE_CONFIGS, 4, resources=(res(
                resource_type=32, resource_name=GROUP_NAME, configuration_keys=None),),
                include_synonyms=False, include_documentation=False)
            return int(r.results[0].error_code), {c.name for c in r.results[0].configs}

        assert await describe(alice) == (E.GROUP_AUTHORIZATION_FAILED, set())
        await s.grant([(Right(Op.READ, ResourceType.GROUP), GROUP_NAME)])   # reading is not describing
        assert await describe(alice) == (E.GROUP_AUTHORIZATION_FAILED, set())
        await s.grant([(Right(Op.DESCRIBE_CONFIGS, ResourceType.GROUP), GROUP_NAME)])
        code, names = await describe(alice)
        assert code == E.NONE and "errors.deadletterqueue.topic.name" in names, (code, names)
        assert (await describe(s.admin))[0] == E.NONE
