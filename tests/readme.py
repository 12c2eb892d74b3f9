"""The README's code blocks, read and run as a newcomer would run them.

Every fenced block of README.md carries, after its language, the way it is
run (its kind) and optional flags::

    ```sh install           pip, then a new project: tests/integration/test_quickstart.py runs the pip lines
    ```sh run               commands run in the project's directory
    ```python settings      appended to the project's settings.py
    ```python settings-variant   a settings module of its own that must pass manage.py check
    ```python file          written to the file its first line names (# myapp/tasks.py)
    ```pycon                a doctest, in one shell session shared by every pycon and session block
    ```python session       run in that session
    ```ini systemd          the unit's ExecStart run, then stopped by its KillSignal in TimeoutStopSec
    ```yaml kubernetes      the pod's command run, its liveness probe passing, stopped in its grace period
    ```sh demo / ```text demo-output   make demo in a fresh virtualenv, its table compared
    flag django6            skipped on Django 5.2 (no django.tasks)
    flag before-django-6.1  skipped on Django 6.1 and later

``Project`` is the project the README builds: ``django-admin startproject``
in a temporary directory, with the interpreter (and so the leasejobs) of
either this checkout's venv (tests/*/test_readme.py) or a fresh virtualenv
(tests/integration/test_quickstart.py), on a database of the test's own. Every process
it starts is stopped by its pid; every wait has a timeout.
"""

import configparser
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import ROOT, wait_until

README = ROOT / "README.md"

#: What each kind of block is run by.
KINDS = {
    "install",
    "run",
    "settings",
    "settings-variant",
    "file",
    "pycon",
    "session",
    "systemd",
    "kubernetes",
    "demo",
    "demo-output",
}
FLAGS = {"django6", "before-django-6.1"}

#: The superuser ``createsuperuser`` makes (it asks for these; the test gives them).
ADMIN = {"username": "admin", "email": "admin@example.com", "password": "readme-admin-password"}

#: A process that runs until stopped, and how the test makes it stoppable and observable.
LONG_RUNNING = ("runworker", "runserver")


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    language: str
    kind: str
    flags: frozenset[str]
    code: str
    line: int  # of the opening fence, counting from 1
    section: str  # the ``## `` heading it is under

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.language} {self.kind})"

    def commands(self) -> list[list[str]]:
        """The command lines of a shell block, as argv lists (comments dropped)."""
        return [
            shlex.split(line, comments=True) for line in self.code.splitlines() if line.split("#")[0].strip()
        ]


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of ``path``, in order, with the way it is run."""
    found = []
    section = ""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^```(\S*)\s*(.*)$", line)
        if fence:
            start = i
            i += 1
            body = []
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            language, words = fence[1], fence[2].split()
            kind = "pycon" if language == "pycon" else (words[0] if words else "")
            flags = frozenset(words[1:] if language != "pycon" else words)
            found.append(Block(language, kind, flags, "\n".join(body) + "\n", start + 1, section))
        i += 1
    return found


def this_venv_bin() -> Path:
    """The bin directory of the interpreter running the tests (a venv's: python, pip, django-admin)."""
    return Path(sys.executable).parent


# -- the database ------------------------------------------------------------------------


@dataclass
class Database:
    """A database of the test's own on the suite's server, dropped at the end (and its test_ twin)."""

    server_url: str  # postgres://user:password@host:port/anything
    name: str

    @property
    def params(self) -> dict[str, Any]:
        url = urllib.parse.urlsplit(self.server_url)
        return {
            "user": urllib.parse.unquote(url.username or "postgres"),
            "password": urllib.parse.unquote(url.password or ""),
            "host": url.hostname or "localhost",
            "port": url.port or 5432,
        }

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(**self.params, dbname="postgres", autocommit=True)

    def create(self) -> None:
        self.drop()
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        with self._admin() as conn:
            for name in (self.name, f"test_{self.name}"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(**self.params, dbname=self.name, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def settings_line(self) -> str:
        """Appended to the README's settings: its DATABASES entry, pointed at this database."""
        p = self.params
        return (
            f'\nDATABASES["default"].update(NAME={self.name!r}, USER={p["user"]!r}, '
            f"PASSWORD={p['password']!r}, HOST={p['host']!r}, PORT={p['port']!r})  # the test's own\n"
        )


# -- the project -------------------------------------------------------------------------

#: Runs pycon blocks as doctests and session blocks as code, in one namespace, one message a line.
SESSION = r"""
import doctest, io, json, sys, traceback
import django
django.setup()
namespace = {"__name__": "__readme__"}
parser = doctest.DocTestParser()
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
for message in sys.stdin:
    block = json.loads(message)
    out = io.StringIO()
    try:
        if block["kind"] == "pycon":
            test = parser.get_doctest(block["code"], namespace, block["name"], "README.md", block["line"])
            ok = runner.run(test, out=out.write, clear_globs=False).failed == 0
            namespace.update(test.globs)  # a DocTest runs in a copy of the namespace
        else:
            exec(compile(block["code"], block["name"], "exec"), namespace)
            ok = True
    except BaseException:
        ok = False
        out.write(traceback.format_exc())
    print("\x1eREADME " + json.dumps({"ok": ok, "report": out.getvalue()}), flush=True)
"""


@dataclass
class Project:
    """The project the README builds, and the processes it runs there."""

    workdir: Path
    bin_dir: Path  # holds python, pip, django-admin
    database: Database
    checkout: Path | None = None  # pip installs "leasejobs" from here; None: pip lines are not run
    log: list[str] = field(default_factory=list)
    _session: subprocess.Popen[str] | None = None
    _lines: "queue.Queue[str | None]" = field(default_factory=queue.Queue)
    _settings_done: bool = False
    _files_done: bool = False

    @property
    def root(self) -> Path:
        return self.workdir / "mysite"

    @property
    def python(self) -> str:
        return str(self.bin_dir / "python")

    def env(self, **extra: str) -> dict[str, str]:
        """A newcomer's environment: this venv first on PATH, none of the test suite's settings."""
        keep = {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("PIP_", "LC_", "LANG")) or k in ("HOME", "TMPDIR")
        }
        return {
            **keep,
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SUPERUSER_PASSWORD": ADMIN["password"],
            **extra,
        }

    def run(self, block: Block, everything: list[Block]) -> None:
        """Run one block of ``everything`` (the README's, or the quickstart's) as its kind says."""
        self.log.append(f"== {block.name}")
        getattr(self, "kind_" + block.kind.replace("-", "_"))(block, everything)

    # -- kinds -------------------------------------------------------------------

    def kind_install(self, block: Block, everything: list[Block]) -> None:
        for argv in block.commands():
            if argv[0] == "pip":
                if self.checkout is None:
                    self.log.append(
                        f"   (pip: run by tests/integration/test_quickstart.py) {shlex.join(argv)}"
                    )
                    continue
                argv = [self.python, "-m", "pip", *[self._from_checkout(a) for a in argv[1:]]]
            self._shell(argv, timeout=600)

    def _from_checkout(self, word: str) -> str:
        match = re.fullmatch(r"leasejobs(\[[\w,]+\])?", word)
        return f"{self.checkout}{match[1] or ''}" if match and self.checkout else word

    def kind_run(self, block: Block, everything: list[Block]) -> None:
        for argv in block.commands():
            self._shell(argv)

    def kind_settings(self, block: Block, everything: list[Block]) -> None:
        # All at once, before anything imports them: a later block's setting
        # (TASKS) must hold when the session imports the tasks.
        if self._settings_done:
            return
        path = self.root / "mysite" / "settings.py"
        for found in everything:
            if found.kind == "settings" and self.wanted(found):
                path.write_text(path.read_text() + "\n" + found.code + self.database.settings_line())
        self._settings_done = True

    def kind_settings_variant(self, block: Block, everything: list[Block]) -> None:
        module = f"settings_variant_{block.line}"
        (self.root / "mysite" / f"{module}.py").write_text(
            "from mysite.settings import *  # noqa\n\n" + block.code
        )
        self._shell(["python", "manage.py", "check", "--settings", f"mysite.{module}"])

    def kind_file(self, block: Block, everything: list[Block]) -> None:
        # All at once too: the session imports myapp.tasks once.
        if self._files_done:
            return
        for found in everything:
            if found.kind == "file" and self.wanted(found):
                first = found.code.splitlines()[0]
                assert first.startswith("# "), f"{found.name}: the first line must name the file"
                path = self.root / first[2:].strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                before = path.read_text() + "\n\n" if path.exists() else ""
                path.write_text(before + found.code)
        self._files_done = True

    def kind_pycon(self, block: Block, everything: list[Block]) -> None:
        self._in_session(block)

    def kind_session(self, block: Block, everything: list[Block]) -> None:
        self._in_session(block)

    def kind_systemd(self, block: Block, everything: list[Block]) -> None:
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.read_string(block.code)
        service = unit["Service"]
        assert service.get("Restart") == "always", block.name
        where = service["WorkingDirectory"]
        argv = shlex.split(service["ExecStart"].replace(where, str(self.root)))
        argv[0] = self.python  # the unit's venv is this one
        stop = getattr(signal, service.get("KillSignal", "SIGTERM"))
        self._supervised(argv, stop, float(service.get("TimeoutStopSec", "90")), probe=None)

    def kind_kubernetes(self, block: Block, everything: list[Block]) -> None:
        import yaml

        pod = yaml.safe_load(block.code)["spec"]
        (container,) = pod["containers"]
        probe = container["livenessProbe"]["exec"]["command"]
        self._supervised(
            container["command"], signal.SIGTERM, float(pod["terminationGracePeriodSeconds"]), probe=probe
        )

    def kind_demo(self, block: Block, everything: list[Block]) -> None:
        self.log.append("   (run by tests/integration/test_quickstart.py::test_make_demo_*)")

    kind_demo_output = kind_demo

    # -- processes ---------------------------------------------------------------

    def wanted(self, block: Block) -> bool:
        if "django6" in block.flags and self._django < (6, 0):
            return False
        return not ("before-django-6.1" in block.flags and self._django >= (6, 1))

    @cached_property
    def _django(self) -> tuple[int, int]:
        """The version of the Django this project runs on (the venv's)."""
        done = subprocess.run(
            [self.python, "-c", "import django; print(*django.VERSION[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        major, minor = done.stdout.split()
        return int(major), int(minor)

    def _cwd(self) -> Path:
        return self.root if self.root.exists() else self.workdir

    def _shell(self, argv: list[str], timeout: float = 180) -> str:
        """Run one command line of a block to its end; a failure fails the test with its output."""
        if "&&" in argv:  # startproject && cd && startapp: a shell's line
            return self._bash(shlex.join(argv).replace("'&&'", "&&"), timeout)
        argv = self._as_test_runs_it(argv)
        if argv[-1] == "runserver" or "runserver" in argv:
            return self._runserver(argv)
        if "runworker" in argv and not {"--burst", "--max-jobs"} & set(argv):
            self._supervised(argv, signal.SIGTERM, 40.0, probe=None)
            return ""
        done = subprocess.run(
            argv, cwd=self._cwd(), env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        self.log.append(f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, self.report()
        return done.stdout

    def _bash(self, line: str, timeout: float) -> str:
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=self._cwd(),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.log.append(f"$ {line}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, self.report()
        return done.stdout

    def _as_test_runs_it(self, argv: list[str]) -> list[str]:
        """What the test adds to a command that would otherwise ask a person (and nothing else)."""
        if argv[0] == "python":
            argv = [self.python, *argv[1:]]
        elif argv[0] == "pip":
            argv = [self.python, "-m", "pip", *argv[1:]]
        if "createsuperuser" in argv:
            argv = [*argv, "--noinput", "--username", ADMIN["username"], "--email", ADMIN["email"]]
        return argv

    def _start(self, argv: list[str], name: str) -> subprocess.Popen[str]:
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 (closed in _stop)
        proc = subprocess.Popen(
            argv, cwd=self._cwd(), env=self.env(), stdout=log, stderr=subprocess.STDOUT, text=True
        )
        proc._readme_log = log  # type: ignore[attr-defined]
        return proc

    def _stop(self, proc: subprocess.Popen[str], how: int, within: float) -> int:
        proc.send_signal(how)
        try:
            code = proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
            self.log.append(f"   did not stop within {within:g} s of {signal.Signals(how).name}")
            code = -999
        proc._readme_log.close()  # type: ignore[attr-defined]
        self.log.append(Path(proc._readme_log.name).read_text()[-4000:])  # type: ignore[attr-defined]
        return code

    def _supervised(self, argv: list[str], stop: int, within: float, probe: list[str] | None) -> None:
        """A worker as a supervisor runs it: started, seen alive (and probed), stopped, exit 0."""
        argv = self._as_test_runs_it(argv)
        proc = self._start(argv, f"worker-{proc_count(self)}")
        try:
            wait_until(
                lambda: (
                    proc.poll() is not None
                    or bool(self.database.query("SELECT 1 FROM leasejobs_worker WHERE pid = %s", [proc.pid]))
                ),
                timeout=60,
                what=f"{shlex.join(argv)} to start",
            )
            assert proc.poll() is None, f"{shlex.join(argv)} exited with {proc.returncode}"
            if probe is not None:
                assert self._shell(probe).startswith("OK: worker "), self.report()
        except BaseException:
            self._stop(proc, signal.SIGKILL, 10)
            raise
        code = self._stop(proc, stop, within)
        self.log.append(f"$ {shlex.join(argv)}: exit {code} after {signal.Signals(stop).name}")
        assert code == 0, self.report()
        if probe is not None:  # a clean stop deletes the worker's row: the probe fails now
            done = subprocess.run(
                self._as_test_runs_it(probe),
                cwd=self._cwd(),
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1 and done.stdout.startswith("UNHEALTHY: "), done.stdout + done.stderr

    def _runserver(self, argv: list[str]) -> str:
        """runserver on a free port, without its autoreloader; log in to the admin and list the jobs."""
        port = free_port()
        proc = self._start([*argv, f"127.0.0.1:{port}", "--noreload"], "runserver")
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: proc.poll() is not None or _answers(base + "/admin/login/"), 60, what="runserver"
            )
            assert proc.poll() is None, "runserver exited"
            page = admin_page(base, "/admin/leasejobs/job/")
            assert "myapp.tasks.send_welcome" in page, page[-2000:]
        finally:
            self._stop(proc, signal.SIGTERM, 20)
        return ""

    def _in_session(self, block: Block) -> None:
        if self._session is None:
            self._session = subprocess.Popen(
                [self.python, "-c", SESSION],
                cwd=self.root,
                env=self.env(DJANGO_SETTINGS_MODULE="mysite.settings"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            threading.Thread(target=_read_lines, args=(self._session, self._lines), daemon=True).start()
        session = self._session
        assert session.stdin is not None
        message = {"kind": block.kind, "code": block.code, "name": block.name, "line": block.line}
        session.stdin.write(json.dumps(message) + "\n")
        session.stdin.flush()
        printed = []
        deadline = time.monotonic() + 120
        while True:  # the session's own output, then its answer
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the session did not answer in 120 s: {''.join(printed)}") from None
            if line is None:
                raise AssertionError(f"the session ended: {''.join(printed)}")
            if line.startswith("\x1eREADME "):
                answer = json.loads(line[len("\x1eREADME ") :])
                break
            printed.append(line)
        self.log.append("".join(printed) + answer["report"])
        assert answer["ok"], self.report()

    def close(self) -> None:
        if self._session is not None:
            assert self._session.stdin is not None
            self._session.stdin.close()
            try:
                self._session.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._session.kill()
                self._session.wait(timeout=10)

    def report(self) -> str:
        return "\n".join(self.log)[-12000:]


def _read_lines(proc: subprocess.Popen[str], lines: "queue.Queue[str | None]") -> None:
    """The session's output, line by line, then None once it ends."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def proc_count(project: Project) -> int:
    return len(list(project.workdir.glob("worker-*.log"))) + 1


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def admin_page(base: str, path: str) -> str:
    """``path`` of the admin, after logging in as the README's superuser through the login form."""
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/admin/login/?next={path}", timeout=30) as response:
        form = response.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, form[-2000:]
    data = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token[1],
            "username": ADMIN["username"],
            "password": ADMIN["password"],
            "next": path,
        }
    ).encode()
    request = urllib.request.Request(f"{base}/admin/login/?next={path}", data=data, headers={"Referer": base})
    with opener.open(request, timeout=30) as response:
        assert response.url.endswith(path), f"not logged in: ended at {response.url}"
        return str(response.read().decode())


def sections(found: list[Block], *names: str) -> Iterator[Block]:
    """The blocks under the ``## `` headings ``names``."""
    return (block for block in found if block.section in names)
