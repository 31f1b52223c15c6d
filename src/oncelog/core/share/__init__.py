"""Share groups (KIP-932, Kafka 4.2's semantics), pure: the share-partition state machine
(`partition`) and share-group membership with its simple assignor (`group`). No I/O; the caller
passes the clock in milliseconds."""
