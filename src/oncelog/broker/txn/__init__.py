"""Transactions on the broker: the coordinator service, the marker writer, and what a partition
leader asks the coordinator before a transactional append."""
