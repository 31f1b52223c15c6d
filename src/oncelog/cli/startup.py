"""A broker or controller that cannot start says why in one line on stderr, with what to do, and
exits non-zero; the traceback is shown only with --log-level DEBUG (a failure this module does
not recognise is a bug: its traceback is always shown)."""
from __future__ import annotations

import errno
import logging
import traceback

import click

from oncelog.broker.net.bind_error import BindError
from oncelog.core.topic_config import ConfigError
from oncelog.storage.cluster_credential import CredentialFileError
from oncelog.storage.dir_lock import DirectoryLocked
from oncelog.storage.log_manager import RegistryDamaged

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def explain(e: BaseException) -> str | None:
    """The one line for a failure a start can meet, or None."""
    if isinstance(e, (BindError, DirectoryLocked, RegistryDamaged, CredentialFileError)):
        return str(e)
    if isinstance(e, ConfigError):
        return f"bad configuration: {e}"
    if isinstance(e, OSError) and e.filename:
        where = e.filename
        if isinstance(e, (FileExistsError, NotADirectoryError)):
            return f"{where} is a file, not a directory: log.dirs (--log-dirs) must name directories"
        if isinstance(e, PermissionError):
            return (f"no permission to write {where}: let the broker's user write there (chown, chmod) or "
                    "choose another --log-dirs")
        if e.errno == errno.ENOSPC:
            return f"no space left on the device of {where}: free some, or choose another --log-dirs"
        return f"cannot use {where}: {e.strerror or e}"
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"an address is already in use ({e.strerror or e}): choose other ports"
    return None


def failure(e: BaseException, log_level: str) -> click.ClickException:
    """What `serve` and `controller` raise for `e`: a one-line ClickException (the traceback
    logged first at DEBUG); `e` itself is re-raised when it is not a known start failure."""
    line = explain(e)
    if line is None:
        raise e
    if log_level.upper() == "DEBUG":
        logging.getLogger("oncelog.cli").debug("".join(traceback.format_exception(e)))
    return click.ClickException(line)
