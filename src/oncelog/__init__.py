"""oncelog: a Kafka-wire-compatible streaming log for exactly-once producing."""
__version__ = "0.1.0"
