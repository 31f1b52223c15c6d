#!/usr/bin/env bash
# Stands in for Apache Kafka's bin/kafka-acls.sh, which librdkafka's suite runs from
# $KAFKA_PATH (see ../../kafka_acls.py). run.py sets KAFKA_PATH to the directory above bin/.
exec "${ONCELOG_COMPAT_PYTHON:-python3}" "$(dirname "$0")/../../kafka_acls.py" "$@"
