"""Java .properties text as java.util.Properties reads it (server.properties, --command-config):
a line ending in an odd number of backslashes continues on the next one, as Kafka's documentation
writes a long sasl.jaas.config; read line by line, its second line was a setting named `username`
and the first kept a backslash."""
import pytest

from oncelog.core.properties import parse_properties
from oncelog.core.security.jaas import parse_sasl_jaas_config, plain_users
from oncelog.core.topic_config import ConfigError

JAAS = """\
# a PLAIN listener's users, as docs/security.md shows them
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\
    username="admin" password="admin-secret" \\
      user_admin="admin-secret" user_alice="alice-secret";
sasl.enabled.mechanisms=PLAIN
"""


def test_a_continued_line_is_one_setting():
    props = parse_properties(JAAS, "server.properties")
    assert sorted(props) == ["listener.name.sasl_ssl.plain.sasl.jaas.config", "sasl.enabled.mechanisms"]
    jaas = props["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert "\\" not in jaas
    assert plain_users(parse_sasl_jaas_config(jaas)) == {"admin": "admin-secret", "alice": "alice-secret"}


def test_an_even_number_of_backslashes_ends_the_line_and_comments_never_continue():
    props = parse_properties("a=x\\\\\nb=y\n# comment \\\nc=z\nd=w\\", "p")
    assert props == {"a": "x\\\\", "b": "y", "c": "z", "d": "w"}


def test_a_line_without_a_separator_is_refused_with_its_number():
    with pytest.raises(ConfigError, match=r"p:3: expected key=value, got 'oops'"):
        parse_properties("a=1\\\n  2\noops\n", "p")
