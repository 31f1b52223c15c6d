#!/usr/bin/env bash
# Stands in for Apache Kafka's bin/kafka-topics.sh, which librdkafka's suite runs from
# $KAFKA_PATH (see ../../kafka_topics.py). run.py sets KAFKA_PATH to the directory above bin/.
exec "${ONCELOG_COMPAT_PYTHON:-python3}" "$(dirname "$0")/../../kafka_topics.py" "$@"
