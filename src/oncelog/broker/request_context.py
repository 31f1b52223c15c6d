"""Who sent the request being handled: (client id, peer host), set per connection task."""
from contextvars import ContextVar

CLIENT: ContextVar[tuple[str | None, str]] = ContextVar("oncelog_request_client", default=(None, ""))

