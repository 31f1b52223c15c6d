"""A group member of oncelog's keeps looking for its coordinator for as long as none can be had
(COORDINATOR_NOT_AVAILABLE: the group's `__consumer_offsets` partition without a live leader, every
broker restarting, say, for longer than a request timeout), as Kafka's clients do; it fails only on
an error no wait can cure."""
from __future__ import annotations

import asyncio
import types

import pytest

from oncelog.client.aio import group as group_module
from oncelog.client.aio.admin_base import AdminError
from oncelog.client.aio.group import AIOGroup, GroupConfig
from oncelog.protocol.errors import ErrorCode as E


def make_group(answers: list, monkeypatch) -> tuple[AIOGroup, list]:
    asked: list = []

    async def find(_cluster, group_id, key_type=0):
        asked.append(group_id)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def dedicated_connection(node):
        return types.SimpleNamespace(node=node, closed=False)

    monkeypatch.setattr(group_module, "find_coordinator", find)
    consumer = types.SimpleNamespace(cluster=types.SimpleNamespace(dedicated_connection=dedicated_connection))
    g = AIOGroup(consumer, GroupConfig.from_dict({"group.id": "g"}))
    g._wait = lambda seconds, until=None: asyncio.sleep(0)   # no real backoff in the test
    return g, asked


def test_a_member_keeps_looking_while_no_coordinator_can_be_had(monkeypatch):
    unavailable = AdminError(E.COORDINATOR_NOT_AVAILABLE, "find the coordinator of g")
    g, asked = make_group([unavailable, unavailable, unavailable, 7], monkeypatch)
    conn = asyncio.run(g._link())
    assert conn.node == 7 and len(asked) == 4


def test_an_error_no_wait_cures_still_fails_the_member(monkeypatch):
    g, _asked = make_group([AdminError(E.GROUP_AUTHORIZATION_FAILED, "find the coordinator of g")], monkeypatch)
    with pytest.raises(AdminError):
        asyncio.run(g._link())
