"""enable.idempotence = off | requested | required against brokers that cannot do it: librdkafka's
mock with InitProducerId removed from ApiVersions, or answering it with an error."""
import logging

import pytest

from oncelog.client import Producer
from oncelog.client.errors import AuthorizationError, IdempotenceUnsupportedError
from oncelog.protocol.errors import ErrorCode as E

INIT_PRODUCER_ID = 22


def produce_some(boot, topic, mode, n=50):
    with Producer({"bootstrap.servers": boot, "enable.idempotence": mode, "linger.ms": 1}) as p:
        futs = [p.send(topic, b"%d" % i) for i in range(n)]
        p.flush(30)
        offs = [f.result(10).offset for f in futs]
        return p.idempotent, p.aio.core.producer_id, offs


@pytest.mark.parametrize("mode", ["requested", "required", "true", "off", "false"])
def test_capable_broker(rdkafka_mock, mode):
    rdkafka_mock.create_topic("m", 1)
    idem, pid, offs = produce_some(rdkafka_mock.bootstrap, "m", mode)
    assert offs == list(range(50))
    assert idem == (mode not in ("off", "false"))
    assert (pid >= 0) == idem


def test_requested_falls_back_without_init_producer_id(rdkafka_mock, caplog):
    rdkafka_mock.create_topic("m", 1)
    rdkafka_mock.set_apiversion(INIT_PRODUCER_ID, -1, -1)
    with caplog.at_level(logging.WARNING, logger="oncelog.client"):
        idem, pid, offs = produce_some(rdkafka_mock.bootstrap, "m", "requested")
    assert not idem and pid == -1 and offs == list(range(50))
    assert "does not support idempotence" in caplog.text and "InitProducerId" in caplog.text


def test_required_fails_clearly_without_init_producer_id(rdkafka_mock):
    rdkafka_mock.set_apiversion(INIT_PRODUCER_ID, -1, -1)
    with pytest.raises(IdempotenceUnsupportedError, match="enable.idempotence=required.*InitProducerId"):
        Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "required"})


def test_requested_falls_back_when_init_producer_id_fails(rdkafka_mock, caplog):
    rdkafka_mock.create_topic("m", 1)
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, E.CLUSTER_AUTHORIZATION_FAILED)
    with caplog.at_level(logging.WARNING, logger="oncelog.client"):
        idem, pid, offs = produce_some(rdkafka_mock.bootstrap, "m", "requested")
    assert not idem and offs == list(range(50))
    assert "CLUSTER_AUTHORIZATION_FAILED" in caplog.text


def test_required_names_the_missing_authorization(rdkafka_mock):
    # a refusal is not a missing feature: the error names it (Java's ClusterAuthorizationException)
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, E.CLUSTER_AUTHORIZATION_FAILED)
    with pytest.raises(AuthorizationError, match="not authorized.*CLUSTER_AUTHORIZATION_FAILED") as refused:
        Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "required"})
    assert "does not support" not in str(refused.value)
    assert refused.value.code == E.CLUSTER_AUTHORIZATION_FAILED


def test_required_fails_clearly_when_init_producer_id_fails(rdkafka_mock):
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, E.UNSUPPORTED_VERSION)
    with pytest.raises(IdempotenceUnsupportedError, match="UNSUPPORTED_VERSION"):
        Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "required"})


def test_retriable_init_producer_id_error_is_retried(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, E.COORDINATOR_LOAD_IN_PROGRESS,
                             E.COORDINATOR_NOT_AVAILABLE)
    idem, pid, offs = produce_some(rdkafka_mock.bootstrap, "m", "required")
    assert idem and pid >= 0 and offs == list(range(50))
