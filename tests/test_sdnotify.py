"""systemd's notify protocol, spoken to a real datagram socket as systemd would listen on it."""

from __future__ import annotations

import os
import socket

import pytest

from slurm_preempt.watch.sdnotify import Notifier


@pytest.fixture
def listener(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0)
    yield path, sock
    sock.close()


def received(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_nothing_without_systemd(listener):
    _path, sock = listener
    notifier = Notifier(environ={})
    notifier.send("READY=1")
    notifier.ping()
    assert notifier.pause is None and received(sock) == []


def test_messages_and_a_rate_limited_watchdog(listener):
    path, sock = listener
    now = [0.0]
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "8000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier(environ=env, monotonic=lambda: now[0])
    assert notifier.pause == 4.0  # the loop never waits longer than half the period without a ping
    notifier.send("READY=1", "STATUS=watching")
    for step in range(9):  # 4.5 s of pings asked for every 0.5 s: sent every 2 s (a quarter period)
        now[0] = step * 0.5
        notifier.ping()
    assert received(sock) == ["READY=1\nSTATUS=watching", "WATCHDOG=1", "WATCHDOG=1", "WATCHDOG=1"]


def test_a_watchdog_meant_for_another_process_is_ignored(listener):
    path, _sock = listener
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "8000000", "WATCHDOG_PID": "1"}
    assert Notifier(environ=env).watchdog is None


def test_an_abstract_socket_name_and_a_missing_socket(caplog, tmp_path):
    name = f"@sp-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name[1:])
    try:
        Notifier(environ={"NOTIFY_SOCKET": name}).send("READY=1")
        assert sock.recv(100) == b"READY=1"
    finally:
        sock.close()
    gone = Notifier(environ={"NOTIFY_SOCKET": str(tmp_path / "none.sock")})
    gone.send("READY=1")
    gone.send("STATUS=x")
    assert sum("cannot notify systemd" in r.getMessage() for r in caplog.records) == 1
