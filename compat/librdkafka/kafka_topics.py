"""The part of Apache Kafka's kafka-topics.sh that librdkafka's suite uses, over the Admin API.

The suite runs `$KAFKA_PATH/bin/kafka-topics.sh --bootstrap-server B --create|--alter|--delete
--topic T [--partitions N] [--replication-factor R] [--config k=v]...` (tests/test.c
test_kafka_topics) where trivup gives it a Kafka distribution. Kafka's tool sends CreateTopics,
CreatePartitions and DeleteTopics through its AdminClient; this does the same through librdkafka's
(confluent-kafka), so the broker sees the requests the real tool would send. Exit status 1 and
the broker's error on stderr when a request fails, as the tool does.
"""
from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kafka-topics.sh")
    p.add_argument("--bootstrap-server", required=True)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true")
    action.add_argument("--alter", action="store_true")
    action.add_argument("--delete", action="store_true")
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int)
    p.add_argument("--replication-factor", type=int, default=-1)
    p.add_argument("--config", action="append", default=[])
    args = p.parse_args(argv)

    admin = AdminClient({"bootstrap.servers": args.bootstrap_server})
    if args.create:
        configs = dict(c.split("=", 1) for c in args.config)
        futures = admin.create_topics([NewTopic(args.topic, args.partitions or -1,
                                                args.replication_factor, config=configs)])
    elif args.alter:
        if args.partitions is None or args.config:
            print("kafka-topics.sh (oncelog compat): --alter supports --partitions only",
                  file=sys.stderr)
            return 2
        futures = admin.create_partitions([NewPartitions(args.topic, args.partitions)])
    else:
        futures = admin.delete_topics([args.topic])
    try:
        for future in futures.values():
            future.result(timeout=60)
    except Exception as exc:  # noqa: BLE001 - the tool prints the broker's error and exits non-zero
        print(f"Error while executing topic command : {exc}", file=sys.stderr)
        return 1
    if args.create:
        print(f"Created topic {args.topic}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
