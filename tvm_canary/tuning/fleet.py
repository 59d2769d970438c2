"""Fleet tuning: candidates measured on RPC servers registered with a TVM RPC tracker.

A fleet is one tracker and any number of servers under one *RPC key* (one key per device model, one server per GPU).
``tvm-canary tune --rpc-tracker HOST:PORT --rpc-key KEY`` builds candidates on the tuning host and measures them on the
servers through MetaSchedule's ``RPCRunner``, one runner worker per server.

The reference check runs on the server, beside the device: ``tvm-canary rpc-server`` is TVM's RPC server
(``tvm.rpc.Server``) registering the global functions below (``tvm_canary.fleet.*``) in every session. They run
``measure``'s own hooks, so a fleet candidate is allocated, checked byte for byte against the torch reference and timed
exactly as locally. TVM's stock ``python -m tvm.exec.rpc_server`` lacks them and is refused by name.

Sessions: by default MetaSchedule opens a session (a forked process on the server) per candidate, so the bucket's case
(valid inputs and reference outputs: seconds to build, up to ~35 GB on a GPU) would be rebuilt per candidate. Here each
runner worker keeps its session for the whole tuning run (``_held``), which keeps the current workload's case
(``measure.case_for``) and ends when the tuning run shuts the runner down. Hence at most one worker per server
(``--rpc-workers`` is checked against the servers the tracker knows).

Hangs: an RPC request for a key whose servers are all taken waits forever, and a server whose session crashed leaves the
tracker (``rpc-server`` then starts a new one). So requests are made only when the tracker lists a free server, every
candidate runs under a timeout (``CANDIDATE_TIMEOUT_S``: the worker is killed, the candidate fails, and the session
process on the server ends itself, ``_session_limit``), and the tracker connection is bounded too. Still run a fleet
under an outer timeout (``scripts/fleet_tune.py`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import functools
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import tvm_ffi

from ..cliargs import UsageError, int_at_least
from ..console import counted

CANDIDATE_TIMEOUT_S = 120  # the first candidate of a workload builds its case (16M entries: seconds)
SESSION_TIMEOUT_S = 3600  # the server ends a session after this; a held session is then reopened
TRACKER_TIMEOUT_S = 30  # connecting to the tracker, and a preflight session's request
# An rpc-server whose tracker has refused connections this long gives up: TVM's server retries the tracker
# for 60 s, then its registration thread dies and the live server can never be reached again.
TRACKER_GONE_S = 90


# -- the server side


def register_server_functions() -> None:
    """Register the fleet's global functions (``tvm_canary.fleet.*``, below); ``tvm.rpc.Server`` calls this in the
    server process before forking sessions, which inherit its imports (torch and tvm_canary load once per server);
    nothing touches CUDA, as a forked session could not use a CUDA context made before the fork; nor is the protocol
    read after the fork (a session would hash files updated since, not the code it runs)."""
    from . import keys, measure  # noqa: F401 - imported before the fork, see above

    measure.protocol()
    for name, func in (("device_info", _device_info), ("run_case", _run_case)):
        tvm_ffi.register_global_func(f"tvm_canary.fleet.{name}", func, override=True)


def _device_info(device_type: str) -> str:
    """JSON ``{"key": device key, "tag": target tag, "protocol": measure.protocol()}`` of the server's
    device (``cuda``: GPU 0, i.e. the first of CUDA_VISIBLE_DEVICES; ``llvm``: the CPU)."""
    import torch

    from ..runtime import targets
    from . import keys, measure

    if device_type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("kv-canary: this RPC server has no CUDA GPU visible to torch")
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    return json.dumps({"key": keys.device_key(device), "tag": targets.tag_for(device), "protocol": measure.protocol()})


class ServerRefused(RuntimeError):
    """A server that must not measure for this run (``_server_info``). Raised in a runner worker, it ends the
    tuning run (``Fleet.runner``) rather than fail candidates, whose records would count as tried."""


tvm_ffi.register_error("tvm_canary.ServerRefused", ServerRefused)  # so it crosses MetaSchedule's C++ loop as itself


def _server_info(session, rpc_key: str, device_type: str, device_key: str | None = None) -> dict:
    """The ``_device_info`` of the server behind ``session``; ``ServerRefused`` when it is no tvm_canary
    server, measures with another protocol than this host (``measure.protocol``: other kernels, timing or
    cases; its times would be ranked with ours) or has a device key other than ``device_key``."""
    from ..runtime.compile import error_line
    from . import measure

    try:
        info = json.loads(_server_function(session, rpc_key, "tvm_canary.fleet.device_info")(device_type))
    except Exception as e:  # the server's own refusal arrives inside TVM's RPCError, as its last line
        if error_line(e).startswith("kv-canary:"):
            raise ServerRefused(error_line(e)) from None
        raise
    ours = measure.protocol()
    if info.get("protocol") != ours:
        raise ServerRefused(f"kv-canary: an RPC server under key {rpc_key!r} runs tvm_canary with another "
                            f"measurement protocol ({info.get('protocol')}, this host {ours}): start the servers "
                            "from this host's tvm_canary")
    if device_key is not None and info["key"] != device_key:
        raise ServerRefused(f"kv-canary: an RPC server under key {rpc_key!r} has device key {info['key']}, "
                            f"expected {device_key} (one RPC key per device model)")
    return info


def _tvm_device(device_type: str):
    import tvm

    return tvm.cuda(0) if device_type == "cuda" else tvm.cpu(0)


def _run_case(rt_mod, bucket: str, device_type: str, number: int, repeat: int, min_repeat_ms: int) -> str:
    """Run a candidate module on its workload's case (``bucket``: JSON list; built once per session and
    workload), checked against the reference and timed by ``measure.run_case`` (a mismatch raises,
    failing the candidate); the times as a JSON list."""
    from . import measure

    config = argparse.Namespace(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    with _session_limit(CANDIDATE_TIMEOUT_S):
        times = measure.run_case(rt_mod, _tvm_device(device_type), config, [[tuple(json.loads(bucket))]])
    return json.dumps([float(t) for t in times])


@contextlib.contextmanager
def _session_limit(seconds: float):
    """End this session process (exit status 1, its stacks on stderr) if the block runs past ``seconds``: TVM's
    server would wait on it up to SESSION_TIMEOUT_S; ended, ``rpc-server`` restarts the server. The watchdog
    is a native thread: a candidate in native code holding the GIL ends too."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def serve(tracker: str, key: str, host: str = "0.0.0.0", port: int = 9090, port_end: int = 9199,
          custom_addr: str | None = None):
    """Start a tvm_canary RPC server registered with ``tracker`` (``HOST:PORT``) under ``key``; returns
    the ``tvm.rpc.Server`` (its ``proc`` serves in a child process)."""
    from tvm import rpc

    # Sessions are forked from the server; torch refuses CUDA in a child forked after the parent asked the
    # CUDA runtime for its devices (torch.cuda.is_available(), which tvm-ffi calls loading its torch bridge).
    # With the NVML-based check the server never touches the CUDA runtime before forking.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    return rpc.Server(host, port, port_end, key=key, tracker_addr=parse_address(tracker), custom_addr=custom_addr,
                      server_init_callback=register_server_functions)


def _listening() -> bool:
    """Run in a ``tvm.rpc.Server``'s process (``serve``): whether its listen thread, registering the server
    with the tracker and serving its sessions, still runs. It ends, leaving the process alive but unreachable,
    when a session process exits non-zero, e.g. killed by a signal (``tvm.rpc.server._serving`` raises), or
    the tracker refused connections for 60 s."""
    from tvm.rpc.server import PopenRPCServerState

    return PopenRPCServerState.current.thread.is_alive()


def _serving(server) -> bool:
    """Whether ``server`` (``serve``'s) still serves: its process is alive and its listen thread runs."""
    try:
        server.proc.send(_listening, timeout=TRACKER_TIMEOUT_S)
        return server.proc.recv()
    except (ChildProcessError, TimeoutError, OSError):  # the process ended or hangs
        return False


# -- the tuning host


def host_port(text: str) -> str:
    """An argparse ``type`` for an RPC tracker's address: ``HOST:PORT`` (``parse_address`` reads it)."""
    try:
        parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("kv-canary: ")) from None
    return text


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"kv-canary: expected HOST:PORT (PORT 0 to 65535) for the RPC tracker, got {text!r}")
    return host, int(port)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """The servers of one RPC key, as the tuning host sees them: ``device_key`` and ``tag`` (target
    tag) of their device, ``workers`` runner workers (one per server used)."""

    host: str
    port: int
    rpc_key: str
    device_type: str  # cuda or llvm
    device_key: str
    tag: str
    workers: int
    # servers registered under the key when last asked (one element, so that a frozen Fleet can update it)
    _last_seen: list = dataclasses.field(default_factory=list, init=False, compare=False, repr=False)

    def require_servers(self) -> None:
        """``tune`` asks before each workload. Waits up to TRACKER_TIMEOUT_S for as many servers as the key had
        last time, at most ``workers`` (a spare server gone costs no wait), as an ``rpc-server`` whose session
        process died re-registers within seconds; raises if none is registered by then (the fleet is gone).
        When fewer remain, says so once on stderr, with how many: each runner worker without a server fails
        every candidate it takes, after TRACKER_TIMEOUT_S."""
        before = self._last_seen[-1] if self._last_seen else self.workers
        wanted = min(before, self.workers)
        servers = _await_servers(self.host, self.port, self.rpc_key, lambda servers, _free: servers >= wanted)[0]
        if servers < wanted:
            print(f"tvm-canary tune: warning: {servers} of the {self.workers} RPC servers under key {self.rpc_key!r} "
                  f"remain registered; the other runner workers fail each candidate they take after "
                  f"{TRACKER_TIMEOUT_S} s (restart the missing servers)", file=sys.stderr, flush=True)
        self._last_seen[:] = [servers]

    def runner(self):
        """MetaSchedule's RPCRunner for a tuning run: held sessions, the server-side case and check."""
        from tvm.s_tir import meta_schedule as ms
        from tvm.support.popen_pool import PopenPoolExecutor

        from . import measure

        runner = ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(self.host, self.port, self.rpc_key, session_timeout_sec=SESSION_TIMEOUT_S),
            evaluator_config=measure.evaluator_config(),
            f_create_session=functools.partial(_held_session, self.device_key, self.device_type),
            f_alloc_argument=_alloc_remote,
            f_run_evaluator=functools.partial(_run_remote, self.device_type),
            f_cleanup=_cleanup_remote,
            max_workers=self.workers,
        )
        # RPCRunner's pool waits without a limit; give it the per-candidate limit (module docstring) that
        # PopenPoolExecutor takes at construction, set afterwards to keep the worker RPCRunner started for
        # its sanity check (one import of TVM).
        assert isinstance(runner.pool, PopenPoolExecutor) and hasattr(runner.pool, "_timeout")
        runner.pool._timeout = CANDIDATE_TIMEOUT_S
        run = runner._inst.run  # MetaSchedule calls the instance's method by name: wrapped here
        runner._inst.run = lambda inputs: [_refusing(future) for future in run(inputs)]
        return runner


def _refusing(future):
    """``future`` (an ``RPCRunnerFuture``) whose ``result`` raises its worker's ``ServerRefused`` (one line),
    not a failed candidate."""
    from ..runtime.compile import error_line

    inner, result = future._inst.future, future._inst.result

    def checked():
        error = inner.exception()  # the worker's, re-created with its traceback as the message
        if isinstance(error, ServerRefused):
            line = error_line(error)
            raise ServerRefused(line[max(line.find("kv-canary:"), 0):])  # from its message on, if it has one
        return result()

    future._inst.result = checked
    return future


def connect(tracker: str, rpc_key: str, device_type: str, workers: int | None) -> Fleet:
    """Check the fleet before tuning: the tracker answers, servers are registered under ``rpc_key``, ``workers``
    (default: one per server) is at most their number, and every server free now (at least one, awaited as by
    ``_request``) is a tvm_canary server with a ``device_type`` device of one device key (``_server_info``; a session on
    each, all held at once so each request reaches another server; one busy with another client is checked by the runner
    worker reaching it, ``Fleet.runner``); that key and target tag name the database and build."""
    host, port = parse_address(tracker)
    servers, free = _registered(host, port, rpc_key)
    workers = servers if workers is None else workers
    if not 1 <= workers <= servers:
        raise ValueError(f"kv-canary: --rpc-workers must be between 1 and the {counted(servers, 'server')} "
                         f"registered under key {rpc_key!r}, got {workers}")
    sessions, info = [], None
    try:
        for _ in range(max(free, 1)):
            sessions.append(_request(host, port, rpc_key))
            info = _server_info(sessions[-1], rpc_key, device_type, info and info["key"])
    finally:
        sessions.clear()
    return Fleet(host, port, rpc_key, device_type, info["key"], info["tag"], workers)


def _bounded(what: str, call, timeout_s: float = TRACKER_TIMEOUT_S):
    """``call()`` in a thread, given up after ``timeout_s`` (tracker calls block without a limit)."""
    box: dict = {}

    def target():
        try:
            box["value"] = call()
        except Exception as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RuntimeError(f"kv-canary: {what}: no answer within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _servers(host: str, port: int, rpc_key: str) -> tuple[int, int]:
    """(servers registered under ``rpc_key``, of which free) according to the tracker."""
    from tvm import rpc

    what = f"RPC tracker at {host}:{port}"
    try:
        socket.create_connection((host, port), timeout=TRACKER_TIMEOUT_S).close()  # TVM retries a refused one for 60 s
        summary = _bounded(what, lambda: rpc.connect_tracker(host, port).summary())
    except (OSError, RuntimeError) as e:
        raise RuntimeError(f"kv-canary: cannot reach the {what} ({e})") from None
    servers = sum(1 for s in summary["server_info"] if s["key"].split(":", 1)[-1] == rpc_key)
    return servers, int(summary["queue_info"].get(rpc_key, {}).get("free", 0))


def _registered(host: str, port: int, rpc_key: str, counts: tuple[int, int] | None = None) -> tuple[int, int]:
    """``counts`` (default: ``_servers``' now); RuntimeError if no server is registered under ``rpc_key``."""
    servers, free = _servers(host, port, rpc_key) if counts is None else counts
    if servers == 0:
        raise RuntimeError(f"kv-canary: the RPC tracker at {host}:{port} has no server under key {rpc_key!r} "
                           f"(start one with `tvm-canary rpc-server --tracker {host}:{port} --key {rpc_key}`)")
    return servers, free


def _await_servers(host: str, port: int, rpc_key: str, ready) -> tuple[int, int]:
    """``_servers``, asked every 0.5 s until ``ready(servers, free)`` or for TRACKER_TIMEOUT_S; the last answer,
    refused as by ``_registered`` if it has no server under ``rpc_key``."""
    deadline = time.monotonic() + TRACKER_TIMEOUT_S
    counts = _servers(host, port, rpc_key)
    while not ready(*counts) and time.monotonic() < deadline:
        time.sleep(0.5)
        counts = _servers(host, port, rpc_key)
    return _registered(host, port, rpc_key, counts)


def _request(host: str, port: int, rpc_key: str, session_timeout: int = 0):
    """A session on a free server of ``rpc_key``, requested once the tracker lists one free (module
    docstring, "Hangs"; a server re-registers a moment after a session ends, an ``rpc-server`` whose session
    crashed returns within seconds); refused after TRACKER_TIMEOUT_S without one, with ``_registered``'s
    error if by then no server is registered under the key."""
    from tvm import rpc

    if _await_servers(host, port, rpc_key, lambda _registered, free: free > 0)[1] == 0:
        raise RuntimeError(f"kv-canary: no free RPC server under key {rpc_key!r} at {host}:{port} within "
                           f"{TRACKER_TIMEOUT_S} s (all taken by other clients, or gone)")
    return _bounded(f"a session on key {rpc_key!r}",
                    lambda: rpc.connect_tracker(host, port).request(rpc_key, priority=1,
                                                                    session_timeout=session_timeout))


def _server_function(session, rpc_key: str, name: str):
    try:
        return session.get_function(name)
    except (AttributeError, RuntimeError) as e:
        raise ServerRefused(f"kv-canary: the RPC server under key {rpc_key!r} lacks {name}: start it with "
                           "`tvm-canary rpc-server` (TVM's `python -m tvm.exec.rpc_server` cannot check candidates "
                           "against the reference)") from e


# -- MetaSchedule's runner hooks (run in the RPCRunner's worker processes)

_held: dict = {}  # this worker's session and the device key it was checked for


def _held_session(device_key: str, device_type: str, rpc_config):
    """The worker's session, opened on first use and reopened if it died or expired; a server
    ``_server_info`` refuses (e.g. under the wrong RPC key) ends the run."""
    session = _held.get("session")
    if session is not None:
        try:
            session.get_function("tvm_canary.fleet.device_info")
            return session
        except Exception:  # noqa: BLE001 - a dead session: open another
            _held.clear()
    session = _request(rpc_config.tracker_host, rpc_config.tracker_port, rpc_config.tracker_key,
                       rpc_config.session_timeout_sec)
    _server_info(session, rpc_config.tracker_key, device_type, device_key)
    _held["session"] = session
    return session


def _alloc_remote(_session, _device, args_info, alloc_repeat):
    """The workload's bucket (``measure.alloc_bucket``); the server builds the case, no arguments travel."""
    from . import measure

    return measure.alloc_bucket(None, args_info, alloc_repeat)


def _run_remote(device_type, session, rt_mod, _device, config, repeated_args):
    """Check and time the candidate on the server (``_run_case``)."""
    (bucket,) = repeated_args[0]
    run = session.get_function("tvm_canary.fleet.run_case")
    return json.loads(run(rt_mod, json.dumps(list(bucket)), device_type, config.number, config.repeat,
                          config.min_repeat_ms))


def _cleanup_remote(session, remote_path) -> None:
    """Remove the candidate's files from the server; the session stays open for the next one."""
    if session is not None and remote_path is not None:
        session.remove(remote_path)
        session.remove(remote_path + ".so")


# -- a fleet on this host (tests, scripts/fleet_tune.py)


@contextlib.contextmanager
def local_fleet(rpc_key: str, server_envs: list[dict], log_dir: pathlib.Path | None = None,
                start_timeout_s: float = 120):
    """Start an RPC tracker on 127.0.0.1 and one ``tvm-canary rpc-server`` per entry of ``server_envs``
    (that server's extra environment, e.g. ``{"CUDA_VISIBLE_DEVICES": "1"}``), wait until every server
    is registered, yield the tracker's ``HOST:PORT``, and stop them all (process groups: TERM, then KILL)
    on exit. The tracker needs ``tornado``. Output goes to ``log_dir`` (tracker.log, server-<i>.log)."""
    package_root = str(pathlib.Path(__file__).resolve().parents[2])  # the servers import this tvm_canary
    pythonpath = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str], extra_env: dict) -> None:
        out = subprocess.DEVNULL if log_dir is None else open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        env = dict(os.environ, PYTHONPATH=pythonpath, **extra_env)
        # A session of its own: each TVM RPC process serves from a child, stopped with it as a group.
        procs.append(subprocess.Popen([sys.executable, *args], env=env, start_new_session=True, stdout=out, stderr=out))
        if out is not subprocess.DEVNULL:
            out.close()

    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    try:
        start("tracker", ["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                          "--port-end", str(port + 1)], {})
        for i, extra_env in enumerate(server_envs):
            start(f"server-{i}", ["-m", "tvm_canary", "rpc-server", "--tracker", address, "--key", rpc_key,
                                  "--host", "127.0.0.1",
                                  "--port", str(_free_port()), "--port-end", "65535"], extra_env)
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(RuntimeError):  # the tracker may not listen yet
                if _servers("127.0.0.1", port, rpc_key)[1] == len(server_envs):
                    break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"kv-canary: the RPC tracker or a server exited at start (logs: {log_dir})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kv-canary: {len(server_envs)} RPC servers not registered "
                                   f"within {start_timeout_s} s")
            time.sleep(0.5)
        yield address
    finally:
        for proc in reversed(procs):
            stop_process_group(proc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a process started with its own session, with its children: TERM, then KILL after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


# -- tvm-canary rpc-server


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("rpc-server", help="serve this host's device to a tuning fleet (TVM RPC)",
                              description="Start a TVM RPC server that measures tuning candidates with the canary's "
                              "reference check, registered with an RPC tracker. One server per GPU: set "
                              "CUDA_VISIBLE_DEVICES to the GPU it serves.")
    p.add_argument("--tracker", required=True, type=host_port, help="the RPC tracker's HOST:PORT")
    p.add_argument("--key", required=True, help="RPC key: one per device model (e.g. h200)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int_at_least(0, 65535), default=9090, help="first port to try")
    p.add_argument("--port-end", type=int_at_least(0, 65535), default=9199,
                   help="end of the port range (not tried itself)")
    p.add_argument("--custom-addr", default=None, help="address to report to the tracker (default: the one it sees)")
    p.set_defaults(func=_serve_command)


def _serve_command(args: argparse.Namespace) -> int:
    """Serve until the tracker has been unreachable for TRACKER_GONE_S (status 1, a ``kv-canary:`` line on stderr) or
    this process gets SIGTERM or SIGINT (status 128 + the signal's number). Every 5 s while the tracker answers, a
    server that stopped serving (``_serving``; e.g. after an OOM-killed or segfaulting candidate's session) is replaced
    by a new one, which registers again, with a ``kv-canary:`` line on stderr and the start line on stdout. Either way
    the server process (holding the port and the tracker registration) is stopped with its sessions
    (``tvm.rpc.Server.terminate``): one stopped with ``kill PID`` leaves nothing behind. A signal during a start is left
    to ``tvm.rpc.Server``'s finalizer, which terminates alike."""

    if args.port_end <= args.port:
        raise UsageError(f"kv-canary: --port-end {args.port_end} must be above --port {args.port} "
                         "(the ports tried are [port, port-end))")

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    def start():
        started = serve(args.tracker, args.key, args.host, args.port, args.port_end, args.custom_addr)
        print(f"tvm_canary RPC server on port {started.port}, key {args.key!r}, tracker {args.tracker}", flush=True)
        return started

    with contextlib.ExitStack() as cleanup:
        for sig in (signal.SIGTERM, signal.SIGINT):
            cleanup.callback(signal.signal, sig, signal.signal(sig, stop))
        server = start()
        cleanup.callback(lambda: server.terminate())  # the server serving then, after any restarts
        host, port = parse_address(args.tracker)
        reached = time.monotonic()
        while True:
            time.sleep(5)
            try:
                socket.create_connection((host, port), timeout=5).close()
                reached = time.monotonic()
            except OSError:
                if time.monotonic() - reached > TRACKER_GONE_S:
                    print(f"kv-canary: the RPC tracker at {args.tracker} has refused connections for "
                          f"{TRACKER_GONE_S} s; this server can no longer register (restart it)", file=sys.stderr)
                    return 1
                continue
            if not _serving(server):
                print("kv-canary: the RPC server stopped serving and left the tracker (a session process exited "
                      "non-zero, e.g. killed by a signal, or the server's process ended); starting a new one",
                      file=sys.stderr, flush=True)
                server.terminate()
                server = start()
