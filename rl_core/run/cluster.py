"""Joining the Ray cluster a run names (``cluster.ray_address``): once per process, the project's code
travelling with the job; and placing the train stage's ranks there. The run's checks before work
(``rl_core.run.preflight``), the train stage's Ray launcher (``rl_core.training.ray_launch``), the rollout
engines (``rl_core.generation.ray_engines``) and the environment workers all join through here.

    connect("ray://head:10001")
    pg, actors, where = place(ctx, Probe, "the check of the train stage's ranks")   # spread, one per rank
    why = probe_rendezvous(actors, where)    # "" when every rank reaches rank 0's rendezvous port
    release(pg, actors)
"""

from __future__ import annotations

from typing import Any

from rl_core.artifacts.paths import PROJECT_ROOT


class PlacementTimeout(RuntimeError):
    """The cluster did not place the actors in time; the message names what it has."""


def connect(address: str, env: str = "", **own: Any) -> None:
    """Join the Ray cluster at ``address`` unless this process already has (``"local"`` with ``own``'s
    ``ray.init`` arguments: a cluster of the run's own). ``env``: the run's ``task.env``; a user's
    environment package the cluster lacks is uploaded with the job (``py_modules``). The job's runtime
    environment is fixed by the first join, so every caller names the run's env."""
    import ray

    from envs.base import env_source

    if not ray.is_initialized():
        source = env_source(env) if env else None
        runtime: dict[str, object] = {
            "env_vars": {"PYTHONPATH": str(PROJECT_ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
            **({"py_modules": [str(source)]} if source is not None else {}),
        }
        ray.init(address=address, log_to_driver=False, runtime_env=runtime, **own)


class Probe:
    """Where a rank's actor is and the rendezvous probe, in a Ray actor's process (the train stage's ranks
    are Probes that also run the job)."""

    def where(self) -> dict[str, Any]:
        """This actor's node (Ray's id and address) and a free port on it (rank 0's is the rendezvous)."""
        import ray

        from rl_core.artifacts.paths import free_port

        ctx = ray.get_runtime_context()
        gpus = ray.get_gpu_ids()  # Ray shows the actor its own GPU only: cuda:0 in here
        device = f"cuda:{gpus[0]} of its node" if gpus else "cpu"
        node, address = ctx.get_node_id(), ray.util.get_node_ip_address()
        return {"node": node, "address": address, "port": free_port(), "device": device}

    def listen(self, address: str, port: int) -> None:
        """Accept connections on ``address:port`` (the rendezvous to be) until ``unlisten``: the peers'
        probe."""
        import socket
        import threading

        self.server = socket.create_server((address, port))  # SO_REUSEADDR: torch binds the port next

        def accept() -> None:
            while True:
                try:
                    conn, _ = self.server.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=accept, daemon=True).start()

    def unlisten(self) -> None:
        """The port closed and free for torch.distributed: shut down first, which wakes the accepting thread
        (a close alone would leave the socket listening while that thread holds it in ``accept``)."""
        import contextlib
        import socket

        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()

    def reach(self, address: str, port: int, timeout_s: float) -> str:
        """ "" when ``address:port`` accepts a TCP connection from this node within ``timeout_s``, else why
        not."""
        return reach(address, port, timeout_s)


def reach(address: str, port: int, timeout_s: float) -> str:
    """ "" when ``address:port`` accepts a TCP connection within ``timeout_s``, else the reason.

    >>> reach("127.0.0.1", 1, 1.0).split(":")[0]
    'ConnectionRefusedError'
    """
    import socket

    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return ""


def unreachable(probes: list[str], where: list[dict[str, Any]], master: tuple[str, int]) -> str:
    """The one line for ranks that could not reach rank 0's rendezvous (``probes[r]``: rank r's answer,
    "" when it reached it); "" when all did.

    >>> w = [{"node": "a" * 20, "address": "10.0.0.1"}, {"node": "b" * 20, "address": "10.0.0.2"}]
    >>> line = unreachable(["", "TimeoutError: timed out"], w, ("10.0.0.1", 29500))
    >>> print(line)  # doctest: +NORMALIZE_WHITESPACE
    rank 1 on Ray node bbbbbbbbbbbb (10.0.0.2) cannot reach rank 0's rendezvous 10.0.0.1:29500
    (TimeoutError: timed out): the nodes must reach each other on any port (firewall, security group,
    NCCL_SOCKET_IFNAME)
    >>> unreachable(["", ""], w, ("10.0.0.1", 29500))
    ''
    """
    bad = [r for r, why in enumerate(probes) if why]
    if not bad:
        return ""
    r = bad[0]
    more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
    return (
        f"rank {r} on Ray node {where[r]['node'][:12]} ({where[r]['address']}) cannot reach rank 0's "
        f"rendezvous {master[0]}:{master[1]} ({probes[r]}){more}: the nodes must reach each other on any "
        "port (firewall, security group, NCCL_SOCKET_IFNAME)"
    )


def probe_rendezvous(ranks: list[Any], where: list[dict[str, Any]], timeout_s: float = 10.0) -> str:
    """Rank 0's actor listens on its rendezvous port and every other rank connects to it, as
    torch.distributed will: the line ``unreachable`` gives ("" when every rank reached it)."""
    import ray

    master = (where[0]["address"], where[0]["port"])
    ray.get(ranks[0].listen.remote(*master))
    try:
        probes = [""] + ray.get([a.reach.remote(*master, timeout_s) for a in ranks[1:]])
    finally:
        ray.get(ranks[0].unlisten.remote())
    return unreachable(probes, where, master)


def place(
    ctx: Any,
    actor_cls: type,
    what: str,
    *,
    count: int | None = None,
    gpus: int | None = None,
    unit: str = "ranks",
) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """A placement group of ``count`` bundles (default: ``train.world_size``), a CPU each and ``gpus`` GPUs
    each (default: one per rank on a GPU machine), spread over the cluster's nodes, an ``actor_cls`` actor (a
    ``Probe``) in each, and where each is (``Probe.where``). ``PlacementTimeout``, naming ``what``, the
    ``count`` ``unit`` and what the cluster has, when it cannot place them within
    ``cluster.ready_timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cluster = ctx.cfg.cluster
    count = ctx.cfg.train.world_size if count is None else count
    gpus = (1 if ctx.placement.trainer_gpus else 0) if gpus is None else gpus
    connect(cluster.ray_address, ctx.cfg.task.env)
    bundle = {"CPU": 1, **({"GPU": gpus} if gpus else {})}
    pg = placement_group([bundle] * count, strategy="SPREAD")
    try:
        ray.get(pg.ready(), timeout=cluster.ready_timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementTimeout(
            f"{what}: the Ray cluster at {cluster.ray_address} did not place {count} {unit} of {bundle} "
            f"within cluster.ready_timeout_s={cluster.ready_timeout_s:g} (it has {ray.cluster_resources()})"
        ) from None
    actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(actor_cls)
    actors = [
        actor.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
        ).remote()
        for i in range(count)
    ]
    try:
        return pg, actors, ray.get([a.where.remote() for a in actors], timeout=cluster.ready_timeout_s)
    except Exception:
        release(pg, actors)
        raise


def release(pg: Any, actors: list[Any]) -> None:
    """The actors killed and their placement group removed."""
    import ray
    from ray.util.placement_group import remove_placement_group

    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)


def check_rendezvous(ctx: Any) -> str:
    """Before any stage: probes placed as a train stage places its ranks, each reaching rank 0's
    rendezvous; "" when they all do, else the line naming the rank that cannot."""
    try:
        pg, actors, where = place(ctx, Probe, "the check of the train stage's ranks")
    except PlacementTimeout as e:
        return str(e)
    try:
        return probe_rendezvous(actors, where)
    finally:
        release(pg, actors)


DIED = "its actor died (node lost or process killed)"


def last_line(e: BaseException) -> str:
    """The last line of a Ray error (the remote exception's own message), at most 300 characters."""
    return str(e).strip().splitlines()[-1][-300:]


def outcomes(refs: list[Any]) -> list[str | None]:
    """What became of each of ``refs`` (actor calls that have ended or are blocked): DIED, "it failed:
    <its exception's last line>", or None (it returned, or is still blocked: killed with its actor)."""
    import ray

    out: list[str | None] = []
    for ref in refs:
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            out.append(DIED)
        except ray.exceptions.RayTaskError as e:
            out.append(f"it failed: {last_line(e)}")
        except ray.exceptions.GetTimeoutError:
            out.append(None)
        else:
            out.append(None)
    return out


def cause(ends: list[str | None]) -> tuple[int, str] | None:
    """The failure to name: the lowest actor that died (its node lost), else the lowest that failed (its
    peers fail after a lost one: the same line whatever order Ray reported them in); None when none did.

    >>> cause([None, "it failed: x", DIED, DIED])
    (2, 'its actor died (node lost or process killed)')
    >>> cause([None, "it failed: x", "it failed: y"]), cause([None, None])
    ((1, 'it failed: x'), None)
    """
    for wanted in (lambda o: o == DIED, lambda o: o is not None):
        hit = next((i for i, o in enumerate(ends) if wanted(o)), None)
        if hit is not None:
            return hit, ends[hit]  # type: ignore[return-value]
    return None
