"""Consumer groups on the broker: the classic protocol, KIP-848 groups, committed offsets."""
