"""The share workload's liveness check (`testing.share_checker`, `starved`, issue 37): a member
alive and polling for long, given nothing while the others were given records all along, is a
finding; a member paused or killed meanwhile (its polls stop), a short stall, and the end of a
run (nobody is given anything) are not. And `spinning`: an oncelog member answered
NOT_LEADER_OR_FOLLOWER far more often than its back-off (retry.backoff.ms) allows."""
from __future__ import annotations

from oncelog.testing.share_checker import ACCEPT, STARVED_S, History, check_share, spinning, starved_stretches

RECORDS = 400


def run(stuck_polls: list[float], stuck_gets: list[float] = ()) -> History:
    """`busy` is given one record every 0.1 s for 40 s (all accepted); `stuck` polls at
    `stuck_polls` and is given a record at each of `stuck_gets`."""
    h = History()
    busy: list[list] = []
    for i in range(RECORDS):
        t = i * 0.1
        busy += [["poll", t], ["got", t + 0.01, 0, i, 1, f"v{i}", t], ["ack", t + 0.02, 0, i, 1, ACCEPT],
                 ["ackd", t + 0.03, 0, i, ACCEPT, None]]
    h.add_events("busy#1", "librdkafka", busy)
    stuck: list[list] = [["poll", t] for t in stuck_polls]
    stuck += [["got", t, 1, n, 1, f"w{n}", t - 0.01] for n, t in enumerate(stuck_gets)]
    stuck += [["fetch-errors", stuck_polls[-1], {"6": 5000}]] if stuck_polls else []
    h.add_events("stuck#1", "oncelog", sorted(stuck, key=lambda e: e[1]))
    return h


def every(begin: float, end: float, step: float = 0.5) -> list[float]:
    return [begin + i * step for i in range(int((end - begin) / step) + 1)]


def test_a_member_polling_for_the_whole_run_without_a_record_is_starved():
    h = run(every(0, 40), stuck_gets=[0.2])
    [(member, begin, end, others)] = starved_stretches(h)
    assert member == "stuck#1" and end - begin >= STARVED_S and others >= 300
    report = check_share({0: [(i, f"v{i}".encode()) for i in range(RECORDS)]}, h, {0: (RECORDS, [])}, 5, 4.0, [])
    [finding] = [f for f in report.findings if f.kind == "starved"]
    assert not report.ok and "stuck#1" in finding.detail and "'6': 5000" in finding.detail
    assert report.figures["NOT_LEADER_OR_FOLLOWER answers to oncelog's members' ShareFetch"] == 5000


def test_a_member_given_records_now_and_then_a_paused_one_and_a_short_stall_are_not():
    assert starved_stretches(run(every(0, 40), stuck_gets=every(1, 40, 10))) == []
    # paused (SIGSTOP) 12 s twice: no stretch of polling long enough
    assert starved_stretches(run(every(0, 12) + every(24, 28) + every(40, 45))) == []
    assert starved_stretches(run(every(0, STARVED_S - 3))) == []


def test_polling_on_after_the_group_ran_dry_is_not_starving():
    # the others' last record comes at 40 s: the stretch is judged up to it only
    assert starved_stretches(run(every(0, 10) + every(38, 90), stuck_gets=[9.9])) == []


def spin_history(answers_per_poll: int) -> History:
    """An oncelog member polling every 0.5 s for 10 s, answered NOT_LEADER_OR_FOLLOWER
    `answers_per_poll` times during each poll (counted at the next poll's start, on a change)."""
    h = History()
    events: list[list] = []
    for i in range(20):
        t = i * 0.5
        if i:
            events.append(["fetch-errors", t, {"6": i * answers_per_poll}])
        events.append(["poll", t])
    h.add_events("oncelog-mixed#1", "oncelog", events)
    return h


def test_a_member_answered_not_leader_hundreds_of_times_a_second_is_spinning():
    # backing off 100 ms with 4 partitions: at most 4 answers per 100 ms, 20 in a poll of 0.5 s
    assert spinning(spin_history(20)) == []
    [(member, _since, _until, n)] = spinning(spin_history(300))
    assert member == "oncelog-mixed#1" and n > 100
    report = check_share({}, spin_history(300), {}, 5, 4.0, [])
    assert [f.kind for f in report.findings] == ["spinning"]
