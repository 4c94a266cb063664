"""Calls on their own daemon thread: results, errors and deadlines come back; a hung call never holds exit."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from trajlake.schemas.threads import DeadlineExceeded, call_with_deadline, run_in_thread


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
        "import threading; from trajlake.schemas.threads import run_in_thread;"
        "run_in_thread(threading.Event().wait, name='hung'); print('bye')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "bye"
