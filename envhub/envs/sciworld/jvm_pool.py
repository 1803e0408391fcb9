"""A process-wide, capped pool of ScienceWorld simulator JVMs, reused across sessions.

A JVM takes about 1.5 s to start and a few hundred MB (its heap is capped with ``-Xmx``), so a
session borrows one on reset, loads its own task on it, and gives it back on close:
1. ``borrow()``: an idle JVM if there is one; else start one while fewer than ``max_jvms`` live;
   else wait, first come first served, until one comes back. The wait has no timeout of its own:
   the caller bounds it (envhub's per-call deadline cancels a reset that waits too long).
2. ``give_back(jvm)``: to the longest waiter, else to the idle list.
3. ``discard(jvm)``: a JVM whose call failed or was interrupted is killed; its slot passes to a
   waiter (who starts a fresh JVM) or is freed.
4. ``shutdown()``: kill every JVM, idle or borrowed; later borrows fail. ``shutdown_pool()``
   runs at interpreter exit (the JVMs also die with this process: ``--die-on-broken-pipe``).

Every simulator call is synchronous, so callers run them through ``pool.run`` (a thread pool
sized to the JVM cap). The pool is thread-safe and serves any event loop: state sits under a
``threading.Lock`` and each waiter is a future of its own loop, woken by ``call_soon_threadsafe``
(envhub serves from a thread's loop, tests from ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import logging
import threading
from typing import Any, Callable, TypeVar

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from scienceworld import ScienceWorldEnv
from scienceworld.constants import BASEPATH, JAR_PATH

from envhub.envs.sciworld.task_index import TASK_TABLE

logger = logging.getLogger(__name__)
Result = TypeVar("Result")
STOP_TIMEOUT_S = 10.0


class PoolClosedError(RuntimeError):
    """The JVM pool was shut down (interpreter exit, or ``shutdown_pool()``)."""


class ScienceWorldJvm(ScienceWorldEnv):
    """One simulator JVM: ScienceWorld's own wrapper, started with a heap cap.

    The stock constructor passes no JVM options (the heap would default to a quarter of the
    machine's memory and grow to GBs), so this one launches the gateway itself and sets the
    attributes the inherited methods read. No Python callback server: the simulator never calls back.
    """

    def __init__(self, max_heap_mb: int) -> None:
        port, process = launch_gateway(classpath=JAR_PATH, javaopts=[f"-Xmx{max_heap_mb}m"], die_on_exit=True,
                                       cwd=BASEPATH, return_proc=True)
        try:
            self._gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port),
                                        java_process=process)
            self.server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except BaseException:
            process.kill()
            raise
        self.taskName, self.simplificationStr, self.variationIdx = None, "", 0
        self.lastStepScore, self.goldPathGenerated, self.runHistories = 0, False, {}
        self.envStepLimit = 10**9  # the actor's turn cap bounds episodes, not the wrapper

    @property
    def pid(self) -> int:
        """Process id of the JVM."""
        return self._gateway.java_process.pid

    def alive(self) -> bool:
        """Whether the JVM process still runs."""
        return self._gateway.java_process.poll() is None

    def close(self) -> None:
        """Kill the JVM (idempotent; also what ``__del__`` calls). A call in flight fails fast."""
        gateway = getattr(self, "_gateway", None)
        if gateway is None:  # the constructor failed before the JVM started
            return
        if gateway.java_process.poll() is None:
            gateway.java_process.kill()
            gateway.java_process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(Exception):
            gateway.close(keep_callback_server=True)  # sockets only; there is no callback server
        # py4j's finalizers tell the JVM about every collected Java object: against a dead JVM each
        # one dials, fails and logs a traceback from inside the garbage collector, whichever code
        # it interrupts (on Python 3.11 that traceback's ast.parse, nested in numpy's header
        # literal_eval, raised "AST constructor recursion depth mismatch"). A disconnected client
        # skips them, and a late call fails at once instead of dialling.
        gateway._gateway_client.is_connected = False


def check_task_table(jvm: ScienceWorldJvm) -> None:
    """Raise if the installed simulator's tasks or variation counts differ from `TASK_TABLE`."""
    expected = {name: variations for name, variations, _, _ in TASK_TABLE}
    actual = {name: jvm.get_max_variations(name) for name in jvm.get_task_names()}
    if actual != expected:
        differing = sorted(set(actual.items()) ^ set(expected.items()))[:6]
        raise RuntimeError(f"sciworld: the installed scienceworld's tasks differ from envhub's task table "
                           f"(envhub/envs/sciworld/task_index.py), e.g. {differing}; update the table")


class JvmPool:
    """At most ``max_jvms`` simulator JVMs, each lent to one session at a time."""

    def __init__(self, max_jvms: int, max_heap_mb: int) -> None:
        self.max_jvms, self.max_heap_mb = max_jvms, max_heap_mb
        self._lock = threading.Lock()
        self._idle: list[ScienceWorldJvm] = []
        self._live: set[ScienceWorldJvm] = set()
        self._slots_taken = 0  # live JVMs plus those starting
        self._waiters: collections.deque[asyncio.Future[ScienceWorldJvm | None]] = collections.deque()
        self._closed = False
        self._table_checked = False
        self.started_total = 0
        self.discarded_total = 0
        # One thread per JVM (a JVM serves one call at a time) plus room for starts and stops.
        self._threads = concurrent.futures.ThreadPoolExecutor(max_jvms + 2, thread_name_prefix="sciworld-jvm")

    def stats(self) -> dict[str, int]:
        """Counts for tests and logs: live, idle, borrowed, starting, waiting JVMs/sessions."""
        with self._lock:
            return {"live": len(self._live), "idle": len(self._idle), "borrowed": len(self._live) - len(self._idle),
                    "starting": self._slots_taken - len(self._live), "waiting": len(self._waiters),
                    "started_total": self.started_total, "discarded_total": self.discarded_total}

    async def run(self, call: Callable[..., Result], *args: Any) -> Result:
        """Run a blocking simulator call on the pool's threads without blocking the event loop."""
        self._check_open()
        return await asyncio.wrap_future(self._threads.submit(call, *args))

    async def borrow(self) -> ScienceWorldJvm:
        """A JVM for the caller alone until it calls `give_back` or `discard`."""
        while True:
            with self._lock:
                self._check_open()
                idle = self._idle.pop() if self._idle else None  # the most recently used: warm heap
                start = idle is None and self._slots_taken < self.max_jvms
                if start:
                    self._slots_taken += 1
                waiter = None if idle is not None or start else asyncio.get_running_loop().create_future()
                if waiter is not None:
                    self._waiters.append(waiter)
            if idle is not None and idle.alive():
                return idle
            if idle is not None:  # died while idle (killed from outside): replace it
                await self.discard(idle)
                continue
            handed = None if start else await self._wait(waiter)
            return handed if handed is not None else await self._start_in_slot()

    async def _wait(self, waiter: asyncio.Future[ScienceWorldJvm | None]) -> ScienceWorldJvm | None:
        """A JVM, or None meaning "a slot is yours: start one"."""
        try:
            return await waiter
        except asyncio.CancelledError:
            with self._lock:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled():  # handed over just before the cancel
                self._pass_on(waiter.result())
            raise

    async def _start_in_slot(self) -> ScienceWorldJvm:
        """Start a JVM in a slot already counted. If the caller is cancelled meanwhile, the JVM
        joins the pool when it is up, so a deadline never leaks a JVM or a slot."""
        started = self._threads.submit(self._start)
        try:
            return await asyncio.shield(asyncio.wrap_future(started))
        except asyncio.CancelledError:
            started.add_done_callback(self._adopt_orphan)
            raise

    def _adopt_orphan(self, started: concurrent.futures.Future[ScienceWorldJvm]) -> None:
        # A failed start already released its slot; a cancelled one only happens at shutdown.
        if not started.cancelled() and started.exception() is None:
            self.give_back(started.result())

    def _start(self) -> ScienceWorldJvm:
        jvm = None
        try:
            jvm = ScienceWorldJvm(self.max_heap_mb)
            if not self._table_checked:
                check_task_table(jvm)
                self._table_checked = True
        except BaseException:
            if jvm is not None:
                jvm.close()
            self._release_slot()
            raise
        with self._lock:
            self._live.add(jvm)
            self.started_total += 1
            closed = self._closed
        if closed:  # shut down while it started
            self.discard_now(jvm)
            raise PoolClosedError("sciworld: the JVM pool was shut down")
        return jvm

    def give_back(self, jvm: ScienceWorldJvm) -> None:
        """Return a healthy JVM: to the longest waiter, else to the idle list."""
        with self._lock:
            keep = not self._closed and jvm in self._live
            if keep and not self._hand_to_waiter(jvm):
                self._idle.append(jvm)
        if not keep:  # the pool shut down, or this JVM was already discarded
            self.discard_now(jvm)

    async def discard(self, jvm: ScienceWorldJvm) -> None:
        """Kill a JVM that failed or was interrupted mid-call; its slot goes to a waiter or is freed."""
        if self._closed:
            self.discard_now(jvm)  # the threads are gone; killing an already-killed JVM is instant
        else:
            await self.run(self.discard_now, jvm)

    def discard_now(self, jvm: ScienceWorldJvm) -> None:
        """Blocking `discard` (for threads and exit handlers)."""
        with self._lock:
            known = jvm in self._live
            self._live.discard(jvm)
            with contextlib.suppress(ValueError):
                self._idle.remove(jvm)
            if known:
                self.discarded_total += 1
        try:
            jvm.close()
        finally:
            if known:
                self._release_slot()

    def _release_slot(self) -> None:
        with self._lock:
            if not self._hand_to_waiter(None):
                self._slots_taken -= 1

    def _hand_to_waiter(self, handed: ScienceWorldJvm | None) -> bool:
        """Give `handed` (a JVM, or None for a free slot) to the longest waiter. Holds the lock."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            try:
                waiter.get_loop().call_soon_threadsafe(self._deliver, waiter, handed)
            except RuntimeError:  # that waiter's event loop is closed
                continue
            return True
        return False

    def _deliver(self, waiter: asyncio.Future[ScienceWorldJvm | None], handed: ScienceWorldJvm | None) -> None:
        # Runs on the waiter's loop; the waiter may have been cancelled since it was picked.
        if waiter.done():
            self._pass_on(handed)
        else:
            waiter.set_result(handed)

    def _pass_on(self, handed: ScienceWorldJvm | None) -> None:
        if handed is None:
            self._release_slot()
        else:
            self.give_back(handed)

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("sciworld: the JVM pool was shut down")

    def shutdown(self) -> None:
        """Kill every JVM (idle or borrowed) and fail all waiters; the pool is unusable after."""
        with self._lock:
            self._closed = True
            jvms, self._idle = list(self._live), []
            self._live.clear()
            waiters, self._waiters = list(self._waiters), collections.deque()
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):
                waiter.get_loop().call_soon_threadsafe(_fail, waiter)
        for jvm in jvms:
            try:
                jvm.close()
            except Exception:  # keep stopping the others
                logger.exception("sciworld: stopping JVM %s failed", jvm.pid)
        self._threads.shutdown(wait=False, cancel_futures=True)


def _fail(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(PoolClosedError("sciworld: the JVM pool was shut down"))


_pool: JvmPool | None = None
_pool_lock = threading.Lock()


def get_pool(max_jvms: int, max_heap_mb: int) -> JvmPool:
    """The process's pool, created on first use with these settings."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = JvmPool(max_jvms, max_heap_mb)
        elif (_pool.max_jvms, _pool.max_heap_mb) != (max_jvms, max_heap_mb):
            raise ValueError(f"sciworld: this process's JVM pool runs with max_jvms={_pool.max_jvms}, "
                             f"jvm_heap_mb={_pool.max_heap_mb}; every sciworld env in one process must use "
                             f"the same (got max_jvms={max_jvms}, jvm_heap_mb={max_heap_mb})")
        return _pool


def shutdown_pool() -> None:
    """Kill every pooled JVM and forget the pool (the next `get_pool` starts a new one)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown()


atexit.register(shutdown_pool)
