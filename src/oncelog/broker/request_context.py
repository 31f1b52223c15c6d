"""Who sent the request being handled: (client id, peer host), set per connection task."""
import inspect
from contextvars import ContextVar

CLIENT: ContextVar[tuple[str | None, str]] = ContextVar("oncelog_request_client", default=(None, ""))


async def maybe_await(value):
    """Storage answers at once; a cluster's topic changes go through the controller and are awaited."""
    return await value if inspect.isawaitable(value) else value
