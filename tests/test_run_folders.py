"""Run folders (``.<name>.<kind>-<host>-<pid>-<random>``) are removed by a later run on the same host once their
PID is dead; containers that share the host's name but number their processes their own way must not read each
other's live runs as dead."""

from __future__ import annotations

import socket
import subprocess
import sys

from lerobot_dali import new_folder

CONTAINER_A, CONTAINER_B = 4026532481, 4026532999


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_containers_sharing_the_host_name_leave_each_others_run_folders(tmp_path, monkeypatch) -> None:
    """With host networking (docker --network host, Kubernetes' hostNetwork) containers share the host's name; a
    shared volume's staging folder of a live run in one container was removed by a run in another, where its PID
    belongs to no process."""
    out = tmp_path / "out"
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_A, raising=False)
    name = new_folder.run_folder(out, "tmp").name
    left = tmp_path / name.replace(f"-{new_folder.os.getpid()}-", f"-{_dead_pid()}-")  # (as seen from B: no process)
    left.mkdir()
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_B, raising=False)
    new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert left.exists()
    monkeypatch.setattr(
        new_folder, "_pid_namespace", lambda: CONTAINER_A, raising=False
    )  # its own container's next run
    new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert not left.exists()


def test_outside_a_container_the_host_name_is_the_hosts(monkeypatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node 7")
    for namespace in (None, 4026531836):  # (no /proc; the initial PID namespace)
        monkeypatch.setattr(new_folder, "_pid_namespace", lambda namespace=namespace: namespace)
        assert new_folder.host_name() == "node_7"
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_A)
    assert new_folder.host_name() == f"node_7.pidns{CONTAINER_A}"
