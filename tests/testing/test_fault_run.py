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
    """Stands in for FaultRunner; its faults all fire at once on start unless `slow_round`."""
    stopped = threading.Event()
    slow_round = False

    def __init__(self, *args, first_round=None, **kwargs) -> None:
        self.events, self.archive, self.error = [], {}, None
        self.first_round = first_round

    def start(self) -> Runner:
        if not Runner.slow_round:
            for _ in range(self.first_round.total):
                self.first_round.one_fired()
        return self

    def stop(self) -> None:
        Runner.stopped.set()


def _run(monkeypatch, tmp_path, workload, timeout_s: float, slow_round: bool = False, faults=("kill",)):
    monkeypatch.setattr(fault_run, "LocalCluster", Cluster)
    monkeypatch.setattr(fault_run, "FaultRunner", Runner)
    Runner.stopped = threading.Event()
    Runner.slow_round = slow_round
    options = VerifyOptions(faults=faults, duration_s=0, timeout_s=timeout_s, workdir=tmp_path)
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


def test_faults_go_on_past_the_window_until_each_fired_once(monkeypatch, tmp_path):
    """On a slow machine the faults take longer than the window: they go on until each had its
    turn, and a workload paced by the round holds records back for the faults still to come."""
    from oncelog.testing.workloads import Workload
    seen: dict[str, object] = {}

    def workload() -> None:
        round_ = run_holder["run"].first_round
        w = Workload("-", "t", 10, "p", share=round_.share)
        values = w.values()
        real = []
        for v in values:
            if v is None:                    # held
                break
            real.append(v)
        seen["held at"] = len(real)          # 2 faults to come: the records of the first two thirds
        seen["stopped while held"] = Runner.stopped.is_set()
        round_.one_fired()
        seen["rest"] = len([v for v in values if v is not None])

    run_holder: dict[str, fault_run.FaultRun] = {}
    real_init = fault_run.FaultRun.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        run_holder["run"] = self
    monkeypatch.setattr(fault_run.FaultRun, "__init__", init)
    _run(monkeypatch, tmp_path, workload, timeout_s=0.2, slow_round=True, faults=("kill", "move"))
    assert seen == {"held at": 7, "stopped while held": False, "rest": 3}
    assert Runner.stopped.is_set()
