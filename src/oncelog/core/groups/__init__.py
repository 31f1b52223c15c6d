"""KIP-848 consumer groups, the pure parts: the group and its members (`consumer_group`), one
heartbeat decided (`heartbeat`), a member's reconciliation towards its target
(`reconciliation`), the server-side assignors (`assignors`) and regex subscriptions
(`subscriptions`)."""
