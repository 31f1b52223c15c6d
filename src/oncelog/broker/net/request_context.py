"""Who sent the request being handled, set by `Dispatcher.handle` for the handlers.

`CLIENT` is (client id, peer host). `PRINCIPAL` is the authenticated principal of the connection
(User:ANONYMOUS on a PLAINTEXT listener); the connection sets it once authentication ends, and the
authorizer reads it. Context variables, because a handler runs in the task of its request.
"""
from collections.abc import Callable
from contextvars import ContextVar

from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal

CLIENT: ContextVar[tuple[str | None, str]] = ContextVar("oncelog_request_client", default=(None, ""))
PRINCIPAL: ContextVar[KafkaPrincipal] = ContextVar("oncelog_request_principal", default=ANONYMOUS)
# Mutes the request's connection for that many ms after its answer (KIP-219 quota throttling);
# None outside a client connection.
MUTE: ContextVar[Callable[[int], None] | None] = ContextVar("oncelog_request_mute", default=None)
# the name of the listener the request came in on (Metadata answers with that listener's addresses)
LISTENER: ContextVar[str] = ContextVar("oncelog_request_listener", default="")

