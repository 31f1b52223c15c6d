"""The broker's links to the rest of its cluster: the controller (registration, heartbeats,
producer-id blocks) and the other brokers."""
