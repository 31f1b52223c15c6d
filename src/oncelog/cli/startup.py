"""A broker or controller that cannot start says why in one line on stderr, with what to do, and
exits non-zero; the traceback is shown only with --log-level DEBUG (a failure this module does
not recognise is a bug: its traceback is always shown)."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import traceback

import click

from oncelog.broker.net.bind_error import BindError
from oncelog.core.topic_config import ConfigError
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.cluster_credential import CredentialFileError
from oncelog.storage.dir_lock import DirectoryLocked
from oncelog.storage.log_manager import RegistryDamaged

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def explain(e: BaseException, dirs: list[str] | tuple[str, ...] = ()) -> str | None:
    """The one line for a failure a start can meet, or None; `dirs`: the data directories."""
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
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return _disk_full([os.path.dirname(str(where)) or str(where)], e.strerror or str(e))
        return f"cannot use {where}: {e.strerror or e}"
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"an address is already in use ({e.strerror or e}): choose other ports"
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        # a write to an open file names none: the data directory is where a start writes
        return _disk_full(dirs, e.strerror or str(e))
    if isinstance(e, KafkaProtocolError) and e.code == ErrorCode.KAFKA_STORAGE_ERROR:
        # the (in-process) controller could not append to its metadata log, or a partition could
        # not be written: a full disk, unless the disks have room (then a failing device)
        full = [d for d in dirs if _free(d) < FULL_BELOW]
        if full:
            return _disk_full(full, str(e))
        return (f"a storage error stopped the start ({e}): the log above names the file and the "
                "error (a failing or read-only device?)")
    return None


FULL_BELOW = 1 << 20   # less free than this: the disk is full for a start (a segment, a snapshot)


def _free(directory: str) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 1 << 62


def _disk_full(dirs, why: str) -> str:
    where = f" of {', '.join(dirs)}" if dirs else ""
    return (f"no space left on the device{where} ({why}): the disk is full; free some space (or move "
            "log.dirs to a larger disk) and start again")


def failure(e: BaseException, log_level: str, dirs: list[str] | tuple[str, ...] = ()) -> click.ClickException:
    """What `serve` and `controller` raise for `e`: a one-line ClickException (the traceback
    logged first at DEBUG); `e` itself is re-raised when it is not a known start failure."""
    line = explain(e, dirs)
    if line is None:
        raise e
    if log_level.upper() == "DEBUG":
        logging.getLogger("oncelog.cli").debug("".join(traceback.format_exception(e)))
    return click.ClickException(line)
