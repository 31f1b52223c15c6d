"""testing.fault_run: the one harness of both `oncelog verify` workloads. Its faults stop after
the first half of the time budget even while the workload still runs (the behaviour only the
transactions workload had), and a workload that ends first ends them at once."""
from __future__ import annotations

import threading

from oncelog.testing import fault_run
from oncelog.testing.verify import VerifyOptions


class Cluster:
    """Stands in for LocalCluster: the harness only starts, stops and switches its proxies."""

    def __init__(self, root, *args, **kwargs) -> None:
        self.data = root / "data"
        self.faults_on: list[bool] = []
        self.stopped = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def set_faults(self, on: bool) -> None:
        self.faults_on.append(on)

    def broker_counters(self) -> dict[str, int]:
        return {"produce errors": 3}


class Runner:
    stopped = threading.Event()

    def __init__(self, *args, **kwargs) -> None:
        self.events, self.archive, self.error = [], {}, None

    def start(self) -> Runner:
        return self

    def stop(self) -> None:
        Runner.stopped.set()


def _run(monkeypatch, tmp_path, workload, timeout_s: float):
    monkeypatch.setattr(fault_run, "LocalCluster", Cluster)
    monkeypatch.setattr(fault_run, "FaultRunner", Runner)
    Runner.stopped = threading.Event()
    options = VerifyOptions(faults=("kill",), duration_s=0, timeout_s=timeout_s, workdir=tmp_path)
    with fault_run.FaultRun(options, "t", {}, set(), print) as run:
        thread = threading.Thread(target=workload, daemon=True)
        run.under_faults([thread], grace_s=5)
        assert not thread.is_alive()
        return run


def test_faults_stop_halfway_through_the_time_budget_while_the_workload_runs(monkeypatch, tmp_path):
    healed_while_running = []

    def workload() -> None:  # runs until the faults stop, which only the heal can do here
        healed_while_running.append(Runner.stopped.wait(30))

    run = _run(monkeypatch, tmp_path, workload, timeout_s=0.4)
    assert healed_while_running == [True]
    assert run.cluster.faults_on[:2] == [False, True] and run.cluster.faults_on[-1] is False
    assert run.broker_answers({"produce errors": "errors"}) == {"errors": 3, "leader moves (controller)": 0}


def test_a_workload_that_ends_first_ends_the_faults(monkeypatch, tmp_path):
    run = _run(monkeypatch, tmp_path, lambda: None, timeout_s=600)
    assert Runner.stopped.is_set() and run.cluster.faults_on[-1] is False
    run.__exit__()
    assert run.cluster.stopped
