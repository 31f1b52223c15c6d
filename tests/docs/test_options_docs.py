"""The lists of settings in the docs are the code's (issue 39: "kept true by a test where a table can
be generated"): docs/spark.md's table of source options is the connector's READ_OPTIONS, its sink
options and every refusal are named there and in docs/coming-from-kafka.md; docs/operations.md
says of every dynamic broker config whether it takes effect (a name added to
core/broker_config.DYNAMIC without a word there fails)."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from oncelog.core import broker_config
from oncelog.spark import options

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i:text.index(end, i + len(start))]


def _spelt(name: str) -> str:
    return options._SPELLING.get(name, name)


def test_the_spark_source_table_is_the_connectors_options():
    table = _between((DOCS / "spark.md").read_text(), "| option | meaning |", "\n\n")
    names = set()
    for first in re.findall(r"^\| ([^|]+) \|", table, re.M)[1:]:     # the header left out (the rule has no blank)
        names |= {n for n in re.findall(r"`([^`]+)`", first)
                  if not n.startswith("kafka.") or n == "kafka.bootstrap.servers"}   # kafka.<x>: client settings
    assert {n.lower() for n in names} == options.READ_OPTIONS, {n.lower() for n in names} ^ options.READ_OPTIONS
    assert all(_spelt(n.lower()) == n for n in names), [n for n in names if _spelt(n.lower()) != n]


def test_every_sink_option_and_every_refusal_is_named():
    spark = (DOCS / "spark.md").read_text()
    writing = spark[spark.index("## Writing"):]
    sink_options = _between(writing, "\nOptions: ", "\n\n")
    for name in options.WRITE_OPTIONS:
        assert f"`{_spelt(name)}`" in sink_options, name
    coming = (DOCS / "coming-from-kafka.md").read_text()
    coming_spark = coming[coming.index("\n## Spark"):]
    reading = spark[spark.index("## Reading"):spark.index("## Writing")]
    for setting in options._FORBIDDEN_READ:
        assert f"`kafka.{setting}`" in reading and f"`kafka.{setting}`" in coming_spark, setting
    for setting in options._FORBIDDEN_WRITE:
        assert f"`kafka.{setting}`" in writing, setting
        assert f"`kafka.{setting}`" in coming_spark or setting == "interceptor.classes", setting


def test_every_dynamic_broker_config_is_said_to_take_effect_or_not():
    section = _between((DOCS / "operations.md").read_text(), "### Dynamic broker configs", "\n### ")
    said = _between(section, "What takes effect at once:", "Change those in")
    patterns = set(re.findall(r"`([a-z][\w.*<>-]*)`", said))
    # the table's first row: "every topic setting's server default above ... except
    # log.message.format.version"
    topic_defaults = {d.server_name for d in broker_config.TOPIC_CONFIGS.values() if d.server_name}
    missing = [name for name in broker_config.DYNAMIC
               if name not in topic_defaults and not any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    assert not missing, f"docs/operations.md says nothing of these dynamic configs: {missing}"
