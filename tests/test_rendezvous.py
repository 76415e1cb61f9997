"""The rendezvous cluster tests use between a test and Spark tasks on other processes: tasks
arrive and wait for the cue; a released rendezvous cues late arrivals at once; closing it
lets every waiter go. Threads stand in for the tasks."""

from __future__ import annotations

import threading

from _timeouts import scaled

from barrierflow.testing.rendezvous import Rendezvous, arrive

WAIT = scaled(20)


def test_tasks_wait_for_the_cue_and_late_ones_go_at_once() -> None:
    results: dict[str, bool] = {}

    def task(tag: str) -> None:
        results[tag] = arrive(meet.port, tag, WAIT)

    with Rendezvous() as meet:
        waiting = [threading.Thread(target=task, args=(t,)) for t in ("0-0", "1-0")]
        for thread in waiting:
            thread.start()
        assert meet.wait_for(2, WAIT)
        assert sorted(meet.arrived) == ["0-0", "1-0"]
        assert results == {}  # both still wait for the cue
        assert not meet.wait_for(3, 0.0)  # nobody else came
        meet.release()
        for thread in waiting:
            thread.join(WAIT)
        assert results == {"0-0": True, "1-0": True}
        assert arrive(meet.port, "0-1", WAIT)  # a retried task, after the release: no wait
        assert meet.wait_for(3, WAIT)


def test_closing_the_rendezvous_lets_a_waiting_task_go() -> None:
    results: list[bool] = []
    meet = Rendezvous()
    thread = threading.Thread(target=lambda: results.append(arrive(meet.port, "x", WAIT)))
    thread.start()
    assert meet.wait_for(1, WAIT)
    meet.close()
    meet.close()  # idempotent
    thread.join(WAIT)
    assert results == [True]
