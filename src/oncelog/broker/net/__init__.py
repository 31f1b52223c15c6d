"""The broker's transport: listening sockets, connections, request dispatch and its error boundary."""
