"""The processes of a Unix session (not collected by pytest): a Spark driver started with
start_new_session=True, its JVM, the JVM's Python daemon and workers (which make process groups of
their own but stay in the session)."""
from __future__ import annotations

import os


def session_pids(sid: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:
            out.append(int(pid))
    return out
