"""Preemption signals as a flag: the first one is noted, nothing else happens in the handler."""

from __future__ import annotations

import os
import signal

from slurm_preempt.job.signal_flag import SignalFlag


def test_the_first_signal_is_noted_and_the_handlers_go_back():
    heard = []
    flag = SignalFlag(heard=lambda: heard.append(1))
    flag.install(("USR1", "SIGUSR2"))
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        first = flag.at
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (flag.name, flag.at, heard) == ("SIGUSR2", first, [1])  # the second one changes nothing
    finally:
        flag.restore()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def test_a_muted_flag_ignores_signals_and_ignore_survives_the_shutdown():
    flag = SignalFlag()
    flag.install(("USR1",))
    try:
        flag.muted = True  # as requeue_and_exit before `scontrol requeue`, which SIGTERMs the job
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.at is None
        flag.ignore()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        flag.restore()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_outside_the_main_thread_nothing_is_installed(caplog):
    import threading

    flag = SignalFlag()
    thread = threading.Thread(target=flag.install, args=(("USR1",),))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert "main thread" in caplog.text
