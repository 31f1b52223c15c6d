"""A misspelt client setting on the command line (`produce -X`, `--command-config`) or as a Spark
`kafka.` option is refused in one line naming it and the nearest known one, instead of doing
nothing (issue 39: `produce -X lingr.ms=5` exited 0)."""
from __future__ import annotations

import pytest
from tests.cli.oncelog_cli import oncelog

from oncelog.spark.options import OncelogSparkError, client_config

pytestmark = pytest.mark.processes

NOWHERE = "127.0.0.1:1"   # refused before any connection is tried


def test_produce_refuses_a_misspelt_producer_property():
    r = oncelog("produce", "t", "-X", "lingr.ms=5", bootstrap=NOWHERE, stdin="a\n")
    assert r.code == 2
    assert r.one_line_error() == 'oncelog: No such configuration property: "lingr.ms" (did you mean "linger.ms"?)'


def test_produce_takes_a_known_producer_property_as_before():
    r = oncelog("produce", "t", "-X", "linger.ms=5", "-X", "request.timeout.ms=1000", "-X",
                "delivery.timeout.ms=1500", bootstrap=NOWHERE, stdin="a\n")
    assert r.code == 3, r.err   # it got as far as trying the cluster


def test_command_config_refuses_a_misspelt_property(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\nsasl.mechansim=PLAIN\n")
    r = oncelog("topic", "list", "--command-config", str(props), bootstrap=NOWHERE)
    assert r.code == 2
    line = r.one_line_error()
    assert str(props) in line and '"sasl.mechansim"' in line and 'did you mean "sasl.mechanism"' in line


def test_a_spark_kafka_option_no_client_knows_is_refused():
    with pytest.raises(OncelogSparkError, match=r'option kafka\.lingr\.ms: No such configuration property: '
                                                r'"lingr\.ms" \(did you mean "linger\.ms"\?\)'):
        client_config({"bootstrap.servers": NOWHERE, "kafka.lingr.ms": "5"})
    assert client_config({"bootstrap.servers": NOWHERE, "kafka.linger.ms": "5"})["linger.ms"] == "5"
