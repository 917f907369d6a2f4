"""Start a group of processes and keep them alive together or stop them together.

Used for the ranks of one node (output prefixed with the rank), for the ssh fan-out (one child per node) and for
mpirun/srun (one child). Guarantees:
  - a child exiting non-zero stops all the others (SIGTERM to each child's process group, SIGKILL after a grace
    period) and the supervisor returns that child's exit code (128+N when it died of signal N);
  - SIGINT/SIGTERM/SIGHUP to the supervisor are forwarded the same way and it returns 128+signal;
  - with watch_stdin, end-of-file on stdin (the ssh connection that started us went away) stops everything too;
  - children get PR_SET_PDEATHSIG=SIGKILL, so even a SIGKILLed supervisor leaves no rank behind, and each runs in
    its own process group so helpers a rank started are killed with it.
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

GRACE_S = float(os.environ.get("DSFAST_KILL_GRACE", "3"))
POLL_S = 0.05
_PR_SET_PDEATHSIG = 1

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
except (OSError, AttributeError):  # not Linux
    _prctl = None


@dataclass
class Child:
    argv: List[str]
    label: str                         # "rank 3" / "node 1 (worker-1)": used in messages
    env: Optional[Dict[str, str]] = None
    prefix: Optional[str] = None        # "[rank3]: " -> capture and prefix every line; None -> inherit stdout/err
    log_path: Optional[str] = None      # also copy the child's output lines here (needs prefix)
    cpus: Optional[List[int]] = None    # pin to these cores
    stdin_pipe: bool = False            # hold a pipe as its stdin; closing it asks the child to stop (ssh)
    stdin_devnull: bool = False
    on_line: Optional[Callable[[bytes], None]] = None  # sees each captured output line (pdsh failure detection)
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _setup_for(parent_pid: int, cpus):
    def setup():
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


class _Output:
    """Line-prefixing copy of a child's pipes to our stdout/stderr (and its log file)."""

    _locks = {1: threading.Lock(), 2: threading.Lock()}

    def __init__(self, child: Child):
        self.prefix = child.prefix.encode()
        self.on_line = child.on_line
        self.log = open(child.log_path, "wb") if child.log_path else None
        self.log_lock = threading.Lock()
        self.threads = [threading.Thread(target=self._pump, args=(child.proc.stdout, 1), daemon=True),
                        threading.Thread(target=self._pump, args=(child.proc.stderr, 2), daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()

    def _pump(self, pipe, fd):
        stream = sys.stdout.buffer if fd == 1 else sys.stderr.buffer
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            if self.log is not None:
                with self.log_lock:
                    self.log.write(line)
                    self.log.flush()
            with self._locks[fd]:
                try:
                    stream.write(self.prefix + line)
                    stream.flush()
                except (OSError, ValueError):  # our reader went away: keep draining so the child never blocks
                    pass
            if self.on_line is not None:
                self.on_line(line)
        pipe.close()

    def join(self, timeout):
        for t in self.threads:
            t.join(timeout)
        if self.log is not None:
            self.log.close()


def _killpg(pid: int, sig: int):
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _say(msg: str):
    try:
        sys.stderr.write(f"dsfast: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Supervisor:
    def __init__(self, children: List[Child], watch_stdin: bool = False, grace: float = GRACE_S,
                 on_failure=None):
        self.children = children
        self.watch_stdin = watch_stdin
        self.grace = grace
        self.on_failure = on_failure  # callable(child, code) -> extra hint text, or None
        self.wake = threading.Event()
        self.stop_signal: Optional[int] = None
        self.signals_seen = 0
        self.outputs: List[_Output] = []
        self.reported_failure = None  # (exit code, message) from fail(), e.g. a remote rank seen in pdsh output

    def fail(self, code: int, message: str):
        """Stop everything and return `code` (callable from any thread)."""
        if self.reported_failure is None:
            self.reported_failure = (code, message)
        self.wake.set()

    # --- stop requests -------------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        self.signals_seen += 1
        if self.stop_signal is None:
            self.stop_signal = signum
        elif self.signals_seen >= 2:  # a second Ctrl-C: no more grace
            for c in self.children:
                if c.proc is not None and c.proc.poll() is None:
                    _killpg(c.proc.pid, signal.SIGKILL)
        self.wake.set()

    def _watch_stdin(self):
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        if self.stop_signal is None:
            self.stop_signal = signal.SIGHUP
        self.wake.set()

    # --- the run -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        in_main = threading.current_thread() is threading.main_thread()
        old = {}
        if in_main:
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[s] = signal.signal(s, self._on_signal)
        try:
            return self._run()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _spawn(self):
        me = os.getpid()
        for c in self.children:
            if self.stop_signal is not None:
                break
            capture = c.prefix is not None
            stdin = subprocess.PIPE if c.stdin_pipe else (subprocess.DEVNULL if c.stdin_devnull else None)
            try:
                c.proc = subprocess.Popen(
                    c.argv, env=c.env, stdin=stdin,
                    stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
                    start_new_session=True, preexec_fn=_setup_for(me, c.cpus), close_fds=True)
            except OSError as e:
                _say(f"cannot start {c.label} ({c.argv[0]}): {e.strerror}")
                return 127
        for c in self.children:
            if c.proc is not None and c.prefix is not None:
                out = _Output(c)
                out.start()
                self.outputs.append(out)
        return 0

    def _run(self) -> int:
        failed = self._spawn()
        if self.watch_stdin:
            threading.Thread(target=self._watch_stdin, daemon=True).start()
        result = failed
        while failed == 0:
            running = 0
            for c in self.children:
                rc = c.proc.poll()
                if rc is None:
                    running += 1
                elif rc != 0 and result == 0:
                    result = exit_code(rc)
                    others = sum(1 for o in self.children if o is not c and o.proc.poll() is None)
                    hint = self.on_failure(c, rc) if self.on_failure else None
                    _say(f"{c.label} exited with code {result}"
                         f"{' (signal ' + signal.Signals(-rc).name + ')' if rc < 0 else ''}"
                         f"{'; ' + hint if hint else ''}"
                         f"{f'; stopping the other {others}' if others else ''}")
            if result == 0 and self.reported_failure is not None:
                result, message = self.reported_failure
                _say(f"{message}; stopping the job")
            if result != 0 or running == 0 or self.stop_signal is not None:
                break
            self.wake.wait(POLL_S)
            self.wake.clear()
        if self.stop_signal is not None and result == 0:
            result = 128 + self.stop_signal
            live = sum(1 for c in self.children if c.proc is not None and c.proc.poll() is None)
            _say(f"received {signal.Signals(self.stop_signal).name}; stopping {live} process(es)")
        self._stop_all(signal.SIGINT if self.stop_signal == signal.SIGINT else signal.SIGTERM)
        for out in self.outputs:
            out.join(timeout=2.0)
        return result

    def _stop_all(self, sig):
        live = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for c in live:  # ssh children: EOF on their stdin makes the remote node launcher stop its ranks
            if c.stdin_pipe and c.proc.stdin:
                try:
                    c.proc.stdin.close()
                except OSError:
                    pass
        if any(c.stdin_pipe for c in live):
            self._wait(live, time.monotonic() + self.grace)
            live = [c for c in live if c.proc.poll() is None]
        for c in live:
            _killpg(c.proc.pid, sig)
        self._wait(live, time.monotonic() + self.grace)
        for c in self.children:  # leftovers: unfinished children and anything a child left in its group
            if c.proc is not None:
                _killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()

    @staticmethod
    def _wait(children, deadline):
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in children):
            time.sleep(POLL_S)
