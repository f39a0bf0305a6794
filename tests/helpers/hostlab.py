"""A lab of several hosts on this one machine, for tests and benchmarks of ringzero across hosts: each host
is a network namespace with its own hostname (UTS namespace) and its own private tmpfs /dev/shm (mount
namespace), joined by a veth pair to a bridge in a lab namespace, each link optionally shaped with
`tc ... tbf`; ranks start per host under `torchrun --nnodes H --node-rank i` with the c10d rendezvous on
host 0's address. Needs root and iproute2 (ip, tc) and util-linux (unshare); missing_requirements() says
what is missing.

Every address exists only inside the namespaces made here; names carry a token unique to the run. close()
(the context manager's exit, atexit, and SIGTERM/SIGHUP while a lab is open) kills the processes the lab
started and deletes the namespaces, which takes their veths, the bridge and the hosts' /dev/shm with them.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBNET = "10.77.0"
"""Host i has SUBNET.(i+1)/24 on its eth0; the addresses exist only inside the lab's namespaces."""
RDZV_PORT = 29400
NAME_PREFIX = "rzlab"
"""Every namespace of a lab is named rzlab<token>-<role>; labs_left() finds leftovers by it."""
_OPEN_LABS: list["HostLab"] = []
STRICT_BURST_MIN_BYTES = 128 << 10
"""The smallest default tbf bucket: above a GSO packet (64 KiB), so tbf never has to cut one.

[Note: the lab's link] tbf lets a full bucket through at the veth's speed, so a bucket of B bytes gives
every sender that idled B / rate seconds B bytes for free. Until 2026-12-02 the default was 1 MiB: 8 ms of
a 1 Gbit/s link after every pause of 8 ms, which no NIC gives. It flattered what pauses (a pipeline's
in-host steps, the gaps between a step's collectives) and beat the link bound (101% for a 16 MiB
reduce-scatter). With 1 ms of the rate (128 KiB at 1 Gbit/s) TCP still fills the link (gloo's bare
point-to-point at 96% of the rate, the ceiling of 1448-byte segments in 1514-byte frames), and the lab's
collectives and training steps are what a NIC at that rate would give. The A/B is in benchmarks/RESULTS.md
("The lab's link was generous")."""


def missing_requirements() -> list[str]:
    """What this machine lacks for a lab (empty when it can make one): root, ip, tc, unshare, hostname."""
    missing = [] if os.geteuid() == 0 else ["root (the lab creates network namespaces; run as root)"]
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux"),
                          ("hostname", "hostname")):
        if shutil.which(tool) is None:
            missing.append(f"the '{tool}' command (package {package})")
    return missing


def labs_left() -> list[str]:
    """Network namespaces of any lab that still exist (none once every lab is closed)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NAME_PREFIX)]


def _sh(*argv: str):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"hostlab: {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclasses.dataclass
class HostRun:
    """What one host's torchrun left: its exit status, output, and the names still in its /dev/shm when
    torchrun had exited (read inside the host's mount namespace, before the tmpfs goes away)."""

    host: int
    returncode: int
    output: str
    shm_left: list[str]


class HostLab:
    """`hosts` hosts. rate_gbit: each link shaped with tbf to this rate in both directions (None:
    unshaped veth); burst_bytes: the tbf bucket (default: 1 ms of the rate, at least 128 KiB: a link
    that, like a NIC, never runs above its rate; see [Note: the lab's link]). same_hostname: every host
    gets one hostname (to check that hosts are still told apart by their /dev/shm). Use as a context manager; close() is idempotent."""

    def __init__(self, hosts: int, rate_gbit: float | None = None, burst_bytes: int | None = None,
                 same_hostname: bool = False):
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        missing = missing_requirements()
        if missing:
            raise RuntimeError("hostlab needs " + "; ".join(missing))
        self.hosts = hosts
        self.rate_gbit = rate_gbit
        self.burst_bytes = burst_bytes or max(STRICT_BURST_MIN_BYTES, int((rate_gbit or 0) * 1e9 / 8 * 1e-3))
        self.token = secrets.token_hex(3)
        self.lab_ns = f"{NAME_PREFIX}{self.token}-lab"
        self.host_ns = [f"{NAME_PREFIX}{self.token}-h{i}" for i in range(hosts)]
        self.hostnames = [f"rzhost{'' if same_hostname else i}" for i in range(hosts)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self.dir = tempfile.mkdtemp(prefix=f"{NAME_PREFIX}{self.token}-")
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        _install_cleanup(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ---- building ---------------------------------------------------------------------------------
    def _build(self):
        _sh("ip", "netns", "add", self.lab_ns)
        _sh("ip", "-n", self.lab_ns, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.lab_ns, "link", "set", "br0", "up")
        with open(os.path.join(self.dir, "hosts"), "w") as f:  # bind-mounted over /etc/hosts in every host
            f.write("127.0.0.1 localhost\n")
            if len(set(self.hostnames)) == self.hosts:
                f.writelines(f"{a} {n}\n" for a, n in zip(self.addresses, self.hostnames))
        for i, ns in enumerate(self.host_ns):
            port = f"port{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", self.lab_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "-n", self.lab_ns, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.rate_gbit:
                # Both directions: the host's egress on its eth0, its ingress as the bridge port's egress.
                for where, dev in ((ns, "eth0"), (self.lab_ns, port)):
                    _sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                        f"{self.rate_gbit}gbit", "burst", str(self.burst_bytes), "latency", "100ms")

    # ---- running ----------------------------------------------------------------------------------
    def host_command(self, host: int, argv: list[str]) -> list[str]:
        """argv run as a process of host `host`: in its network namespace, in a fresh UTS namespace with
        its hostname and a fresh mount namespace with a private tmpfs /dev/shm and the lab's /etc/hosts;
        when argv exits, the names left in /dev/shm are written to <lab dir>/shm-left-<host>."""
        script = ('hostname "$1" && mount -t tmpfs -o size=1g,mode=1777 rzlabshm /dev/shm && '
                  'mount --bind "$2/hosts" /etc/hosts && shift 3 && "$@"; rc=$?; '
                  'ls -A /dev/shm > "$LAB_DIR/shm-left-$HOST"; exit $rc')
        return ["ip", "netns", "exec", self.host_ns[host], "unshare", "--uts", "--mount", "--propagation",
                "private", "sh", "-c", f"LAB_DIR='{self.dir}'; HOST={host}; {script}", "sh",
                self.hostnames[host], self.dir, "--", *argv]

    def torchrun_argv(self, host: int, nproc: int, script_argv: list[str], max_restarts: int = 0) -> list[str]:
        """torchrun of host `host` with `nproc` ranks, the c10d rendezvous on host 0 (what a real cluster
        runs on each node, with the lab's addresses; is_host says outright which node serves the
        rendezvous store instead of torch's guess from the hostname)."""
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.hosts), "--node-rank",
                str(host), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"{self.addresses[0]}:{RDZV_PORT}", "--rdzv-id", f"{NAME_PREFIX}{self.token}",
                "--rdzv-conf", f"is_host={int(host == 0)}", "--local-addr", self.addresses[host],
                "--max-restarts", str(max_restarts), "--monitor-interval", "0.5", *script_argv]

    def start(self, ranks_per_host: list[int], script_argv: list[str], env: dict | None = None,
              max_restarts: int = 0) -> list[subprocess.Popen]:
        """Starts torchrun on every host (ranks_per_host[i] ranks on host i; script_argv: what torchrun
        runs, e.g. [script.py, args...] or [-m, module, args...]). PYTHONPATH gets this clone's python/;
        RINGZERO_HOST_ID is removed so that the ranks find their hosts themselves. Output: wait()."""
        if len(ranks_per_host) != self.hosts:
            raise ValueError(f"ranks_per_host has {len(ranks_per_host)} entries for a lab of {self.hosts} hosts")
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        full_env.pop("RINGZERO_HOST_ID", None)
        full_env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), full_env.get("PYTHONPATH", "")])
        procs = []
        for host, nproc in enumerate(ranks_per_host):
            argv = self.host_command(host, self.torchrun_argv(host, nproc, script_argv, max_restarts))
            procs.append(subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True))
        self._procs += procs
        return procs

    def wait(self, procs: list[subprocess.Popen], timeout_s: float) -> list[HostRun]:
        """Waits for every host's torchrun (all killed after timeout_s in total, then TimeoutError with the
        output so far)."""
        deadline = time.monotonic() + timeout_s
        runs = []
        for host, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill_all()
                outs = [q.communicate()[0] for q in procs]
                raise TimeoutError(f"hostlab: torchrun still running after {timeout_s} s; output:\n" +
                                   "\n".join(f"--- host {h}\n{o[-3000:]}" for h, o in enumerate(outs)))
            shm_file = os.path.join(self.dir, f"shm-left-{host}")
            shm_left = open(shm_file).read().split() if os.path.exists(shm_file) else ["<not listed>"]
            runs.append(HostRun(host, p.returncode, out, shm_left))
        return runs

    def run(self, ranks_per_host: list[int], script_argv: list[str], env: dict | None = None,
            timeout_s: float = 300, max_restarts: int = 0) -> list[HostRun]:
        """start() then wait()."""
        return self.wait(self.start(ranks_per_host, script_argv, env, max_restarts), timeout_s)

    def cut(self, host: int):
        """Cuts host `host` off the network (its bridge port down): its packets are lost, no connection
        is closed (what a pulled cable or a dead switch port does)."""
        _sh("ip", "-n", self.lab_ns, "link", "set", f"port{host}", "down")

    def sent_bytes(self) -> list[int]:
        """Bytes each host has sent onto the lab's network so far (its bridge port's received bytes: whole
        frames, TCP/IP headers included): the cross-host traffic, counted outside the hosts."""
        return [int(_sh("ip", "netns", "exec", self.lab_ns, "cat", f"/sys/class/net/port{i}/statistics/rx_bytes"))
                for i in range(self.hosts)]

    def shm_names(self, proc: subprocess.Popen) -> list[str]:
        """The names in /dev/shm of the host that `proc` (one of start()'s, still running) belongs to:
        `ip netns exec` and `unshare` exec in place, so proc's pid is in the host's mount namespace."""
        return _sh("nsenter", "-t", str(proc.pid), "-m", "ls", "-A", "/dev/shm").split()

    def stop(self):
        """Kills every process the lab started (each host's whole session)."""
        self._kill_all()

    # ---- cleanup ----------------------------------------------------------------------------------
    def _kill_all(self, reap: bool = True):
        """SIGKILL to every process in the hosts' network namespaces (torchrun puts its workers in sessions
        of their own, so killing the host's session alone would leave them), then to the sessions."""
        for ns in self.host_ns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self._procs:
            if p.poll() is not None:  # reaped: its pid may be someone else's by now
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if reap:  # not from a signal handler: it may have interrupted this Popen's own wait (its lock)
                p.wait()

    def close(self, reap: bool = True):
        """Kills what the lab started and deletes everything it made (idempotent). reap=False: from a
        signal handler (the killed processes are not waited for)."""
        if self._closed:
            return
        self._closed = True
        self._kill_all(reap)
        for ns in [*self.host_ns, self.lab_ns]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _OPEN_LABS:
            _OPEN_LABS.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _close_open_labs(reap: bool = True):
    for lab in list(_OPEN_LABS):
        lab.close(reap)


def _on_signal(signum, frame):
    _close_open_labs(reap=False)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup(lab: HostLab):
    """Registers lab for close() at interpreter exit and on SIGTERM/SIGHUP (the first lab installs the hooks)."""
    if not _OPEN_LABS and not getattr(_install_cleanup, "installed", False):
        atexit.register(_close_open_labs)
        # SIGINT stays KeyboardInterrupt: the context manager's exit and atexit close the lab then.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _on_signal)
        _install_cleanup.installed = True
    _OPEN_LABS.append(lab)
