"""What handlers see of the partitions (`seam.Logs`), a cluster member's implementation of it, and
the fsync batching that acks=all answers wait for."""
