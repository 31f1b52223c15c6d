"""The connection settings of issue 25 (findings 5 and 6) are checked as Kafka checks them."""
import pytest

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.controller.connection_limits import ConnectionLimits


def test_a_failed_logins_delayed_close_must_come_before_the_idle_close():
    """Kafka's KafkaConfig rule, for the broker's settings and the controller's."""
    with pytest.raises(ConfigError, match="connection.failed.authentication.delay.ms=1000 should always be less "
                                          "than connections.max.idle.ms=1000"):
        BrokerConfig({"connections.max.idle.ms": "1000", "connection.failed.authentication.delay.ms": "1000"})
    with pytest.raises(ConfigError, match="delay.ms=5000"):
        BrokerConfig({"connections.max.idle.ms": "1000", "listeners": "EXT://127.0.0.1:0",
                      "listener.security.protocol.map": "EXT:PLAINTEXT",
                      "listener.name.ext.connection.failed.authentication.delay.ms": "5000"})
    assert BrokerConfig({"connections.max.idle.ms": "-1", "connection.failed.authentication.delay.ms": "5000"})
    with pytest.raises(ValueError, match="should always be less than connections.max.idle.ms=100"):
        ConnectionLimits.from_settings({"connections.max.idle.ms": 100}.get)
    assert ConnectionLimits.from_settings({}.get) == ConnectionLimits()
