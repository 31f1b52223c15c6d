"""Who sent the request being handled: (client id, peer host), set by `Broker.handle_request`."""
from contextvars import ContextVar

CLIENT: ContextVar[tuple[str | None, str]] = ContextVar("oncelog_request_client", default=(None, ""))

