"""The part of Apache Kafka's kafka-acls.sh that librdkafka's suite uses, over the Admin API.

The suite runs `$KAFKA_PATH/bin/kafka-acls.sh --bootstrap-server B --add|--remove [--force]
--allow-principal|--deny-principal P --operation Op --allow-host|--deny-host H --topic T|--group G`
(tests 0109, 0115, 0119). Kafka's tool sends CreateAcls and DeleteAcls through its AdminClient;
this does the same through librdkafka's (confluent-kafka). `--remove` deletes the bindings the
options name exactly (a LITERAL pattern, as the tool's default `--resource-pattern-type literal`).
Exit status 1 and the broker's error on stderr when a request fails, as the tool does.
"""
from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kafka-acls.sh")
    p.add_argument("--bootstrap-server", required=True)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true")
    action.add_argument("--remove", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--allow-principal", action="append", default=[])
    p.add_argument("--deny-principal", action="append", default=[])
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--deny-host", action="append", default=[])
    p.add_argument("--operation", action="append", default=[])
    p.add_argument("--topic", action="append", default=[])
    p.add_argument("--group", action="append", default=[])
    p.add_argument("--transactional-id", action="append", default=[])
    p.add_argument("--cluster", action="store_true")
    p.add_argument("--resource-pattern-type", default="literal")
    args = p.parse_args(argv)

    pattern = ResourcePatternType[args.resource_pattern_type.upper()]
    resources = ([(ResourceType.TOPIC, t) for t in args.topic] + [(ResourceType.GROUP, g) for g in args.group]
                 + [(ResourceType.TRANSACTIONAL_ID, x) for x in args.transactional_id]
                 + ([(ResourceType.BROKER, "kafka-cluster")] if args.cluster else []))
    operations = [AclOperation[o.upper().replace("-", "_")] for o in args.operation or ["All"]]
    entries = ([(pr, h, AclPermissionType.ALLOW) for pr in args.allow_principal for h in args.allow_host or ["*"]]
               + [(pr, h, AclPermissionType.DENY) for pr in args.deny_principal for h in args.deny_host or ["*"]])
    bindings = [AclBinding(rt, name, pattern, pr, h, op, perm)
                for rt, name in resources for pr, h, perm in entries for op in operations]
    admin = AdminClient({"bootstrap.servers": args.bootstrap_server})
    try:
        if args.add:
            for f in admin.create_acls(bindings).values():
                f.result(30)
        else:
            filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                        b.operation, b.permission_type) for b in bindings]
            for f in admin.delete_acls(filters).values():
                f.result(30)
    except Exception as e:  # noqa: BLE001 - the tool's behaviour: the error on stderr, exit 1
        print(f"Error while executing ACL command: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
