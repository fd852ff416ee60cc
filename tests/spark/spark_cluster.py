"""A real Spark standalone cluster for tests, from pyspark's own distribution, and a driver to submit to it.

`SparkStandaloneCluster(root)` runs `spark-class org.apache.spark.deploy.master.Master` and two
`...deploy.worker.Worker` processes on 127.0.0.1 (free ports, 1 core and a small heap each, every
directory under `root`: SPARK_LOCAL_DIRS, the workers' work dirs, the daemons' logs). `start()` returns
once the master's JSON status page lists every worker ALIVE; `stop()` ends the daemons, every executor
and Python worker under them and every driver submitted through `submit()` / `launch()`, each by the PID
recorded before it was signalled (SIGTERM, SIGKILL after a bound), and a test runner that dies takes the
daemons with it (PR_SET_PDEATHSIG).

Jobs run as Spark users run them: `spark-submit --master spark://127.0.0.1:PORT --jars <connector jars>
script.py args...` (`submit` waits for the exit, `launch` returns the running driver). The driver is its
own process, so a test process that holds a local SparkSession (tests/spark/conftest.py's `spark`) can
drive a cluster job too: pyspark allows one SparkContext per Python process.

Faults: `executor_pids()` lists the executors' JVMs (CoarseGrainedExecutorBackend processes under the
workers); SIGKILL one and the master has a worker start a new executor for the application.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from broker_process import free_port, wait_until  # tests/integration (on sys.path through conftest.py)

from city_pipeline.session import ConnectorJarsError, find_connector_jars
from pykbroker.cluster.zk_server import die_with_parent
from spark_guard import connector_jars_dir, connector_missing_reason

READY_TIMEOUT_S = 180.0  # three JVMs starting side by side on a loaded 2-core machine
STOP_TIMEOUT_S = 20.0
STATUS_TIMEOUT_S = 5.0
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_TASK_LINE = re.compile(r"Executor: (Running|Finished) task .*\(TID (\d+)\)")

# What every driver submitted to the cluster sets, beside the caller's conf (tests/spark/conftest.py passes its
# SPARK_TEST_CONF): small executors (Spark's minimum is 450 MiB, 1.5 times the 300 MiB it reserves), one
# core each, and the test's Python on both sides.
CLUSTER_DRIVER_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.driver.memory": "512m",
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
}


def spark_home() -> Path:
    """The installed pyspark's directory: its bin/spark-class and jars/ are a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_missing_reason() -> str | None:
    """Why a standalone cluster with the Kafka connector cannot run here (pyspark, Java, jars), or None."""
    reason = connector_missing_reason()
    if reason:
        return reason
    for tool in ("spark-class", "spark-submit"):
        if not os.access(spark_home() / "bin" / tool, os.X_OK):
            return f"{spark_home() / 'bin' / tool} is missing or not executable"
    return None


def connector_jars() -> list[Path]:
    """The connector jars (../shared/refkit/spark-jars or $PYKBROKER_SPARK_JARS) for --jars."""
    directory = connector_jars_dir()
    if not directory:
        raise ConnectorJarsError("no connector jar directory (see tests/spark/spark_guard.py)")
    return find_connector_jars(directory)


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return table


def descendants(pid: int, table: Mapping[int, tuple[int, str]] | None = None) -> list[int]:
    """Every process below pid (children, their children, ...), parents before children."""
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, queue = [], list(children.get(pid, ()))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, ()))
    return found


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def terminate_tree(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM `process` (the processes below it are recorded first, by PID), wait up to `timeout`, then
    SIGKILL it and whatever of the recorded processes still runs. Returns its exit status."""
    if process.poll() is not None:
        return process.returncode
    below = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)  # the JVMs' shutdown hooks end their own children (a worker's executors) first
    _signal([pid for pid in below if _alive(pid)], signal.SIGKILL)
    return process.returncode


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL `process` and every process below it (recorded by PID first): a driver that dies at once."""
    below = descendants(process.pid)
    process.kill()
    _signal(below, signal.SIGKILL)
    process.wait(10)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path}: {exc})"


class SparkStandaloneCluster:
    """A Spark standalone master and `workers` workers on 127.0.0.1, with files under `root`."""

    def __init__(self, root: Path, *, workers: int = 2, worker_cores: int = 1, worker_memory: str = "768m",
                 daemon_memory: str = "256m", driver_conf: Mapping[str, str] | None = None):
        self.root = Path(root)
        self.driver_conf = {**(driver_conf or {}), **CLUSTER_DRIVER_CONF}
        self.workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.daemon_memory = daemon_memory
        self.master_port = 0
        self.master_ui_port = 0
        self.master: subprocess.Popen | None = None
        self.worker_processes: list[subprocess.Popen] = []
        self.drivers: list[subprocess.Popen] = []
        self._logs: list[Path] = []

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}/json/"

    def env(self) -> dict[str, str]:
        """The environment of every process of the cluster and of its drivers: loopback only, scratch space
        and configuration in `root`, the test's Python for PySpark."""
        env = dict(os.environ)
        env.pop("SPARK_HOME", None)  # spark-class finds pyspark's own distribution
        env.update({
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_CONF_DIR": str(self.root / "conf"),  # empty: no spark-defaults.conf from elsewhere
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONUNBUFFERED": "1",
            # a port taken between free_port() and the bind fails the start at once, not on port + 1
            "SPARK_MASTER_OPTS": "-Dspark.port.maxRetries=0",
            "SPARK_WORKER_OPTS": "-Dspark.port.maxRetries=0",
        })
        return env

    # -- lifecycle ------------------------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = self.root / "logs" / f"{name}.log"
        self._logs.append(log)
        with open(log, "ab") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env(), cwd=self.root, start_new_session=True,
                                    preexec_fn=die_with_parent)

    def start(self, timeout: float = READY_TIMEOUT_S) -> "SparkStandaloneCluster":
        for directory in ("local", "conf", "logs"):
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.master_port, self.master_ui_port = free_port(), free_port()
        self.master = self._spawn("master", [
            spark_class, MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port),
            "--webui-port", str(self.master_ui_port)])
        for index in range(self.workers):
            work_dir = self.root / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            self.worker_processes.append(self._spawn(f"worker-{index}", [
                spark_class, WORKER_CLASS, "--host", "127.0.0.1", "--port", str(free_port()),
                "--webui-port", str(free_port()), "--cores", str(self.worker_cores),
                "--memory", self.worker_memory, "--work-dir", str(work_dir), self.master_url]))
        try:
            self.wait_workers_alive(self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "SparkStandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Drivers first, then the workers (their executors with them), then the master; never raises for a
        slow process (everything still running after the bounds is SIGKILLed by PID)."""
        for process in [*self.drivers, *self.worker_processes, self.master]:
            if process is not None:
                terminate_tree(process)

    # -- state ----------------------------------------------------------------------------------------

    def _check_running(self) -> None:
        for name, process in [("master", self.master)] + [(f"worker-{i}", p)
                                                         for i, p in enumerate(self.worker_processes)]:
            if process is not None and process.poll() is not None:
                raise AssertionError(f"Spark {name} exited with {process.returncode}\n"
                                     f"{_tail(self.root / 'logs' / f'{name}.log', 60)}")

    def status(self) -> dict:
        """The master's JSON status page (workers, alive workers, active and completed applications)."""
        with urllib.request.urlopen(self.status_url, timeout=STATUS_TIMEOUT_S) as answer:
            return json.load(answer)

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError, urllib.error.URLError):
            return 0
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def wait_workers_alive(self, count: int, timeout: float = READY_TIMEOUT_S) -> None:
        def ready() -> bool:
            self._check_running()
            return self.alive_workers() >= count

        wait_until(ready, f"{count} Spark workers ALIVE at {self.status_url}", timeout)

    def executor_pids(self) -> list[int]:
        """The running executor JVMs the workers started (for every application), oldest first."""
        table = _process_table()
        pids = []
        for worker in self.worker_processes:
            pids += [pid for pid in descendants(worker.pid, table)
                     if EXECUTOR_CLASS in table[pid][1] and _alive(pid)]
        return sorted(pids)

    def executor_log(self, pid: int) -> Path:
        """The stderr file the worker gives executor `pid` (work-dir/<app id>/<executor id>/stderr)."""
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        app, executor = args[args.index("--app-id") + 1], args[args.index("--executor-id") + 1]
        logs = list(self.root.glob(f"worker-*/{app}/{executor}/stderr"))
        if len(logs) != 1:
            raise FileNotFoundError(f"executor {pid}: {len(logs)} logs for {app}/{executor} under {self.root}")
        return logs[0]

    def running_tasks(self, pid: int) -> set[int]:
        """Task ids executor `pid` started and has not finished, from its log (Spark's INFO lines
        "Running task ... (TID n)" and "Finished task ... (TID n)")."""
        started, finished = set(), set()
        try:
            text = self.executor_log(pid).read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            return set()  # no log yet (the worker is starting it), or the executor is gone
        for line in text.splitlines():
            match = _TASK_LINE.search(line)
            if match:
                (started if match.group(1) == "Running" else finished).add(int(match.group(2)))
        return started - finished

    def wait_executors(self, count: int, *, exclude: Iterable[int] = (), timeout: float = READY_TIMEOUT_S,
                       driver: subprocess.Popen | None = None) -> list[int]:
        """Until at least `count` executors not in `exclude` run (failing at once if `driver` exited)."""
        exclude = set(exclude)
        found: list[int] = []

        def enough() -> bool:
            self._check_running()
            if driver is not None and driver.poll() is not None:
                raise AssertionError(f"the driver exited with {driver.returncode} while waiting for executors")
            found[:] = [pid for pid in self.executor_pids() if pid not in exclude]
            return len(found) >= count

        wait_until(enough, f"{count} Spark executors besides {sorted(exclude)}", timeout)
        return list(found)

    # -- drivers --------------------------------------------------------------------------------------

    def submit_command(self, script: str | Path, *args: str, conf: Mapping[str, str] | None = None) -> list[str]:
        """spark-submit to this master in client mode, with the connector jars and driver_conf (+ conf)."""
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url,
                   "--jars", ",".join(str(jar) for jar in connector_jars())]
        for key, value in {**self.driver_conf, **(conf or {})}.items():
            command += ["--conf", f"{key}={value}"]
        return command + [str(script), *map(str, args)]

    def launch(self, script: str | Path, *args: str, log: Path, conf: Mapping[str, str] | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Start a driver (its output appended to `log`); stop() ends it if the test did not."""
        log = Path(log)
        self._logs.append(log)
        with open(log, "ab") as out:
            driver = subprocess.Popen(self.submit_command(script, *args, conf=conf), stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env={**self.env(), **(env or {})}, cwd=self.root,
                                      start_new_session=True, preexec_fn=die_with_parent)
        self.drivers.append(driver)
        return driver

    def submit(self, script: str | Path, *args: str, log: Path, timeout: float,
               conf: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> str:
        """Run a driver to its end; AssertionError with the log's tail unless it exits 0. Returns the log."""
        driver = self.launch(script, *args, log=log, conf=conf, env=env)
        try:
            status = driver.wait(timeout)
        except subprocess.TimeoutExpired:
            terminate_tree(driver)
            raise AssertionError(f"{Path(script).name} still running after {timeout:.0f} s\n{_tail(log, 80)}")
        output = Path(log).read_text(errors="replace")
        assert status == 0, f"{Path(script).name} exited with {status}\n{_tail(log, 80)}"
        return output

    # -- reports --------------------------------------------------------------------------------------

    def failure_sections(self) -> list[tuple[str, str]]:
        sections = [(f"spark {log.name}", _tail(log, 60)) for log in self._logs]
        for stderr in sorted(self.root.glob("worker-*/app-*/*/stderr"))[-4:]:
            sections.append((f"spark executor {stderr.parent.parent.name}/{stderr.parent.name}", _tail(stderr, 40)))
        return sections

    def __repr__(self) -> str:
        return f"SparkStandaloneCluster({self.master_url}, {len(self.worker_processes)} workers)"
