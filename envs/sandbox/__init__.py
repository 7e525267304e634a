"""Sandbox for untrusted, model-written code.

Each run executes ``argv`` (by default ``python3 main.py``) in a fresh bubblewrap container:

- **Namespaces**: user, mount, pid, net, ipc, uts, cgroup (``--unshare-all``). The filesystem is a new root
  holding only read-only ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64`` links), a private ``/proc`` of the
  sandbox's own pid namespace, four device nodes in ``/dev`` (null, zero, random, urandom; mounted read-only,
  so their host timestamps cannot be set), and the workdir ``/work``: a tmpfs capped at ``disk_mb``, holding
  the run's files, written from memory (never a host path). The root is remounted read-only. The network
  namespace has only a down loopback.
- **Identity**: the process runs as uid 65534 inside and, outside, as a uid of its own (``UID_BASE`` + slot),
  never root: it cannot signal, trace or read anything of another uid, and per-uid limits count only it.
- **seccomp**: a filter (libseccomp) refuses with EPERM ptrace, mount/umount, namespace creation
  (unshare, setns, clone with any namespace flag), kernel keyrings, bpf, perf_event_open, userfaultfd,
  io_uring, kernel modules, kexec, reboot, swap, clock changes, process_vm_readv/writev, kcmp,
  open_by_handle_at, and sockets of any family but AF_UNIX. A syscall name it cannot resolve is an error.
- **Limits**: rlimits (address space = ``memory_mb``, CPU seconds, file size = ``disk_mb``, 256 open files,
  ``max_procs`` processes, no core dumps), a per-run cgroup (pids.max and the memory limit, v1 or v2) and
  a wall-clock timeout after which the whole process tree is killed (process group, cgroup, pid namespace).
- **pid 1**: ``init.py``, not bubblewrap's reaper: non-dumpable and holding none of the run's stdio, so the
  program cannot read back a stdin it closed, write into pid 1's memory to forge its output or status, or
  clear pid 1's parent-death signal to outlive the run; it ignores the program's signals and exits with the
  program's status, and the kernel then kills what is left in the namespace (``test_sandbox_init.py``).
- **Environment**: cleared; bubblewrap itself is started with an empty environment too, so ``/proc/1/environ``
  inside holds nothing of the host.
- **Output**: stdout and stderr are read concurrently and kept up to ``output_bytes`` each; a program that
  writes more than ``OUTPUT_KILL_FACTOR`` times that is stopped ("output_limit").
- **Leftovers**: when the run ends, every process left in its cgroup is killed, the cgroup removed (or, in a
  dedicated worker, emptied), and the tmpfs disappears with the mount namespace. Dedicated sandbox processes
  (the pool's workers) are child subreapers and reap bubblewrap's briefly orphaned pid-1 process after every
  run; long-lived callers should run sandboxes through ``SandboxPool`` rather than ``Sandbox`` directly.

**Pool workers reuse their container** (``SandboxPool``, the default ``reuse=True``; ``Sandbox(dedicated=True,
reuse=True)``): each worker starts one container as above, running the supervisor ``zygote.py``, and gives
every run namespaces of its own inside it: new user, mount, pid, IPC, UTS and network namespaces, a fresh
/proc and a fresh tmpfs /work, then the run's seccomp filter, hard rlimits, and the container's cgroup set to
the run's limits. The worker process is never in that cgroup (nor is any process that starts a sandbox):
memory a run hides from every process's size (memfds, detached SysV shared memory) still fills the cgroup, and
the OOM killer then stops the run for ``memory``, never the worker (``tests/sandbox/test_hidden_memory.py``).
Nothing a run leaves in kernel state (SysV shared memory, semaphores and message queues, POSIX message queues,
abstract Unix sockets, the pid counter, /work's inode numbers, mode, times and xattrs) reaches the next run;
``tests/sandbox/test_sandbox_reuse.py`` attacks each kind. The supervisor is outside the run's pid namespace
and not dumpable; if it stops answering or cannot set a run up, the next run gets a new container. This saves
the container set-up per run (``benchmarks/sandbox.py``); ``reuse=False`` gives every run a new container, as
``Sandbox.run`` outside a pool always does.

Module layout, one mechanism each (its docstring states what it covers and what it does not): ``seccomp.py``,
``cgroup.py``, ``slots.py`` (per-run host uid), ``bwrap.py`` (namespaces and filesystem), ``output.py``
(capture and verdict), ``fresh.py`` (a run in a new container), ``container.py`` and ``zygote.py`` (the reused
container), ``core.py`` (the ``Sandbox`` facade), ``limits.py``, ``pool.py``.

What it does **not** protect against: kernel vulnerabilities (the code shares the host kernel: a kernel
exploit escapes; use gVisor or a VM for hostile workloads at scale), side channels (timing, cache, CPU
frequency), denial of service through shared resources it is allowed to use (CPU time up to the limits,
memory bandwidth), and anything mounted into the sandbox on purpose (``/usr`` is readable: the installed
programs and libraries are visible). Without cgroup access the per-run memory and pids limits fall back to
rlimits only, and the address-space limit does not count memory held in files (memfds, SysV shared memory,
pipe buffers): there a run can hold far more than ``memory_mb``. Without user namespaces bubblewrap cannot
run at all. In either case ``Sandbox`` refuses with
``SandboxUnavailable`` unless the weaker mode is named explicitly: ``Sandbox(mode="rlimits")``,
``rlfoundry sandbox exec --mode rlimits``, or ``RLFOUNDRY_SANDBOX_MODE=rlimits`` for the environments (no
per-run cgroup; rlimits, namespaces, seccomp and the timeout stay). No mode runs code without bubblewrap.

    from envs.sandbox import Sandbox, Limits
    sb = Sandbox()
    r = sb.run({"main.py": "print(6 * 7)"}, limits=Limits(timeout_s=5))
    r.exit_code, r.stdout          # 0, "42\\n"
"""

from envs.sandbox.core import Sandbox, check_available
from envs.sandbox.limits import Limits, SandboxUnavailable
from envs.sandbox.output import SandboxResult

__all__ = ["Limits", "Sandbox", "SandboxResult", "SandboxUnavailable", "check_available"]
