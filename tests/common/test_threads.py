"""Calls on their own daemon thread: results, errors and deadlines come back; a hung call never holds exit."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from trajlake.common.threads import DeadlineExceeded, call_with_deadline, once_per_key, run_in_thread


def test_the_result_and_the_error_come_back_through_the_future():
    assert run_in_thread(lambda: 41 + 1, name="t").result(5) == 42
    with pytest.raises(ZeroDivisionError):
        run_in_thread(lambda: 1 / 0, name="t").result(5)


def test_a_call_past_its_deadline_raises_and_is_left_running():
    release = threading.Event()
    with pytest.raises(DeadlineExceeded, match=r"slow took longer than 0\.05s"):
        call_with_deadline(lambda: release.wait(30), 0.05, name="slow")
    release.set()


def test_a_timeout_raised_by_the_call_itself_is_not_a_deadline():
    def fails() -> None:
        raise TimeoutError("the call's own")

    with pytest.raises(TimeoutError, match="the call's own") as info:
        call_with_deadline(fails, 5, name="own")
    assert not isinstance(info.value, DeadlineExceeded)


def test_a_hung_call_does_not_keep_the_interpreter_alive():
    code = (
        "import threading; from trajlake.common.threads import run_in_thread;"
        "run_in_thread(threading.Event().wait, name='hung'); print('bye')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "bye"


def test_once_per_key_loads_each_key_once_however_many_threads_ask_at_once():
    calls: list[str] = []
    release = threading.Event()

    @once_per_key(maxsize=4)
    def load(key: str) -> str:
        calls.append(key)
        release.wait(5)  # every other caller arrives while this load runs
        return key.upper()

    results: list[str] = []
    arrived = threading.Semaphore(0)

    def ask(key: str) -> None:
        arrived.release()
        results.append(load(key))

    threads = [threading.Thread(target=ask, args=(k,)) for k in "aaaaab"]
    for t in threads:
        t.start()
    for _ in threads:
        assert arrived.acquire(timeout=5)
    release.set()  # the first load of "a" ends after every caller asked for it
    for t in threads:
        t.join(5)
    assert sorted(calls) == ["a", "b"]
    assert sorted(results) == ["A"] * 5 + ["B"]


def test_once_per_key_caches_no_error_and_drops_the_least_recently_used_key():
    calls: list[int] = []

    @once_per_key(maxsize=2)
    def load(n: int) -> int:
        calls.append(n)
        if n < 0:
            raise ValueError(n)
        return n

    for _ in range(2):
        with pytest.raises(ValueError):
            load(-1)
    assert calls == [-1, -1]  # the failure was tried again
    load(1), load(2), load(1), load(3)  # 2 is the least recently used when 3 arrives
    load(1), load(2)
    assert calls[2:] == [1, 2, 3, 2]
