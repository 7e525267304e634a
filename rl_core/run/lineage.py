"""MLflow lineage: a parent run per experiment, a child run per iteration, one batch of metrics per stage.

Run ids are passed explicitly (never the "active run"), because Prefect tasks may run in other threads.
Each stage's manifest is logged as an artifact of its iteration's run and its artifact URIs as tags, so the
MLflow UI walks from a checkpoint back to the rollouts and rewards that produced it.

    lin = Lineage.open(cfg)
    parent = lin.experiment_run(run_id, cfg, base_id)
    child = lin.iteration_run(parent, run_id, 3, flow_run_id="...")
    lin.log_stage(child, manifest)

Stage and summary records go through a ``LineageWriter`` (``rl_core.run.lineage_writer``), in submission
order; ``flush`` re-raises the first failure (the flow flushes each iteration's records one iteration later,
and everything at its end).
Where they are written is ``tracking.writes`` (``write_mode``): when MLflow and the store are on this
machine, in a writer process for a run of PROCESS_FROM_ITERATIONS or more, else in the flow's thread at the
iteration's end; across a network, on a background thread while the next stages run.

A local MLflow write is CPU work in Python (SQLAlchemy over SQLite, ~65 ms an iteration), and a thread doing
it beside the generate stage takes the interpreter lock from it over a hundred times per stage. The writer
process shares no lock with the stages, and the flow's thread only hands it the iteration's records (pickled,
one job an iteration: ~0.4 ms): 9-14% shorter steps on this project's 2-core machines
(``benchmarks/lineage_writes.py``: process against inline in one run); it starts with the flow, ready
before the first write (``benchmarks/lineage_short_runs.py``: short runs whole). A remote
MLflow or S3 is another matter: its writes wait on the network, without the lock, and a thread hides that
wait. A write handed to the process is a picklable callable (a module-level function with its arguments:
``functools.partial``); the process opens its own MLflow client. If the flow is killed, the process ends with
it, and what it had not written is written again by ``rlfoundry resume``, which logs every committed
iteration's records anew (MLflow's own lineage of a committed train stage included, when it is missing).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.paths import state_dir
from rl_core.schema.config import Config

# The stages whose tables are logged as dataset inputs of their iteration's run: train's are the rollouts and
# rewards the policy update read.
log = logging.getLogger("rlfoundry.lineage")
LINEAGE_TABLE_STAGES = ("train",)


def tracking_uri(cfg: Config) -> str:
    return cfg.tracking.mlflow_uri or f"sqlite:///{state_dir() / 'mlflow.db'}"


# From how many iterations ``auto`` writes a local run's records in the writer process. It starts with the
# flow, its imports and MLflow's store opened (~2.9 CPU seconds) while the engines start, and saves ~40-65 ms
# of each step (benchmarks/lineage_writes.py): runs of 8 steps ended sooner with it, whole
# (benchmarks/lineage_short_runs.py); shorter ones (the tests' smoke runs, 1-5 iterations) write inline.
PROCESS_FROM_ITERATIONS = 8


def write_mode(cfg: Config) -> str:
    """Where ``cfg``'s lineage records are written (``tracking.writes``): ``inline`` (the flow's thread, at
    the iteration's end), ``background`` (a thread of the flow's process) or ``process`` (a writer process:
    no interpreter lock shared with the stages); auto: when the MLflow tracking store and the artifact store
    are both on this machine (CPU work), ``process`` for a run of PROCESS_FROM_ITERATIONS or more, else
    ``inline``; ``background`` across a network (waits on a socket, without the lock).

    >>> from rl_core.schema.config import Config
    >>> write_mode(Config()), write_mode(Config.model_validate({"store": {"uri": "s3://b/p"}}))
    ('process', 'background')
    >>> write_mode(Config.model_validate({"experiment": {"iterations": 7}}))
    'inline'
    >>> write_mode(Config.model_validate({"tracking": {"mlflow_uri": "http://127.0.0.1:5000"}}))
    'background'
    """
    if cfg.tracking.writes != "auto":
        return cfg.tracking.writes
    here = ("", "file", "sqlite")
    store = urlsplit(cfg.store.uri).scheme if cfg.store.uri else ""
    if urlsplit(tracking_uri(cfg)).scheme not in here or store not in here:
        return "background"
    return "process" if cfg.experiment.iterations >= PROCESS_FROM_ITERATIONS else "inline"


def metric_name(name: str) -> str:
    """MLflow allows only [A-Za-z0-9_-. :/] in metric names: pass@8 -> pass_at_8."""
    return name.replace("@", "_at_")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


class Lineage:
    def __init__(self, client: Any, experiment_id: str):
        self.client = client
        self.experiment_id = experiment_id
        # run id -> {iteration: its MLflow run}: searched once per run in this process, then kept as this
        # process creates them (a search per iteration was among the costliest of its MLflow calls)
        self._iteration_runs: dict[str, dict[int, str]] = {}

    @classmethod
    def open(cls, cfg: Config) -> Lineage | None:
        if not cfg.tracking.enabled:
            return None
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(cfg)
        client = MlflowClient(tracking_uri=uri)
        name = f"rlfoundry/{cfg.experiment.name}"
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            artifacts = None
            if cfg.store.uri.startswith("s3://"):
                artifacts = f"{cfg.store.uri.rstrip('/')}/_mlflow"  # lineage artifacts beside the run's own
            elif uri.startswith("sqlite:"):
                artifacts = (state_dir() / "mlartifacts").as_uri()
            exp_id = client.create_experiment(name, artifact_location=artifacts)
        return cls(client, exp_id)

    def _find(self, **tags: str) -> str | None:
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def experiment_run(self, run_id: str, cfg: Config, base_id: str) -> str:
        found = self._find(**{"rlfoundry.run_id": run_id, "rlfoundry.kind": "experiment"})
        if found:
            return found
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_id,
            tags={"rlfoundry.run_id": run_id, "rlfoundry.kind": "experiment", "rlfoundry.base_id": base_id},
        )
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in sorted(_flatten(cfg.model_dump(mode="json")).items())]
        for i in range(0, len(params), 90):
            self.client.log_batch(run.info.run_id, params=params[i : i + 90])
        return run.info.run_id

    def _runs_of(self, run_id: str) -> dict[int, str]:
        """The iteration runs of ``run_id`` in MLflow by iteration: one search, then this process's record."""
        if run_id not in self._iteration_runs:
            query = f"tags.`rlfoundry.run_id` = '{run_id}' and tags.`rlfoundry.kind` = 'iteration'"
            found: dict[int, str] = {}
            token = None
            while True:
                page = self.client.search_runs(
                    [self.experiment_id], filter_string=query, max_results=1000, page_token=token
                )
                for r in page:
                    found.setdefault(int(r.data.tags["rlfoundry.iteration"]), r.info.run_id)
                token = page.token
                if not token:
                    break
            self._iteration_runs[run_id] = found
        return self._iteration_runs[run_id]

    def iteration_run(self, parent: str, run_id: str, iteration: int, flow_run_id: str | None = None) -> str:
        tags = {
            "rlfoundry.run_id": run_id,
            "rlfoundry.iteration": str(iteration),
            "rlfoundry.kind": "iteration",
        }
        known = self._runs_of(run_id)
        found = known.get(iteration)
        flow = {"prefect.flow_run_id": flow_run_id} if flow_run_id else {}
        if found is None:  # created with every tag at once (one call)
            tags |= {"mlflow.parentRunId": parent, **flow}
            name = f"{run_id}/iter-{iteration:04d}"
            run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
            known[iteration] = run.info.run_id
            return run.info.run_id
        if flow_run_id:  # (a resumed iteration: the flow run that now carries it)
            self.client.set_tag(found, "prefect.flow_run_id", flow_run_id)
        return found

    def log_stage(self, mlflow_run: str, manifest: Manifest, step: int | None = None) -> None:
        self.log_stages(mlflow_run, [manifest], step)

    def log_stages(self, mlflow_run: str, manifests: list[Manifest], step: int | None = None) -> None:
        """The stages' metrics (``<stage>/<name>``, at the iteration as step) and output and input URIs as
        tags, in as few ``log_batch`` calls as MLflow's limits allow (one per iteration: a call costs ~15 ms
        on SQLite whatever it holds), the manifests as artifacts (``manifests/<stage>.json``, one upload),
        and MLflow's own lineage of each stage run now (``log_lineage``)."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics: list[Any] = []
        tags: dict[str, Any] = {}
        for m in manifests:
            stage, at = m.stage, m.iteration if step is None else step
            metrics += [
                Metric(metric_name(f"{stage}/{k}"), float(v), now, at)
                for k, v in m.metrics.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            ]
            metrics.append(Metric(f"{stage}/seconds", float(m.timings.seconds), now, at))
            for name, out in m.outputs.items():
                held = out.stored is False
                tags[f"{stage}.{name}.uri"] = f"{out.uri} (not stored)" if held else out.uri
            tags |= {f"{stage}.input.{name}.uri": inp.uri for name, inp in m.inputs.items()}
            if "policy_sha256" in m.metrics:
                tags["policy_sha256"] = m.metrics["policy_sha256"]
        run_tags = [RunTag(k, v) for k, v in tags.items()]
        calls = max(-(-len(metrics) // 1000), -(-len(run_tags) // 100), 1)  # MLflow's limits per call
        for c in range(calls):
            part = {"metrics": metrics[c * 1000 : (c + 1) * 1000], "tags": run_tags[c * 100 : (c + 1) * 100]}
            self.client.log_batch(mlflow_run, **part)
        with tempfile.TemporaryDirectory(prefix="rlf-manifests-") as folder:  # one upload for them all
            for m in manifests:
                text = json.dumps(m.model_dump(mode="json"), indent=2)
                (Path(folder) / f"{m.stage}.json").write_text(text, encoding="utf-8")
            self.client.log_artifacts(mlflow_run, folder, "manifests")
        for m in manifests:  # a resumed run's stage: only what its first attempt did not write
            self.log_lineage(mlflow_run, m, missing_only=m.reused)

    def log_lineage(self, mlflow_run: str, manifest: Manifest, missing_only: bool = False) -> None:
        """The stage's place in MLflow's own lineage: the tables the update read (rollouts, rewards) as the
        run's dataset inputs, the checkpoint it wrote as a logged model of the run. Both point at the store
        (nothing is copied into MLflow). ``missing_only`` (a stage committed before a resume, whose records
        the killed flow may not have written): each only when the run does not have it yet."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        k = manifest.iteration
        tables = [
            (n, r) for n, r in (manifest.inputs | manifest.outputs).items() if r.uri.endswith(".parquet")
        ]
        if tables and missing_only and manifest.stage in LINEAGE_TABLE_STAGES:
            have = {d.dataset.name for d in self.client.get_run(mlflow_run).inputs.dataset_inputs}
            tables = [(n, r) for n, r in tables if f"{n}-iter-{k:04d}" not in have]
        if tables and manifest.stage in LINEAGE_TABLE_STAGES:
            inputs = [
                DatasetInput(
                    Dataset(
                        name=f"{name}-iter-{k:04d}",
                        digest=ref.sha256[:36],
                        source_type="s3" if ref.uri.startswith("s3://") else "local",
                        source=json.dumps({"uri": ref.uri}),
                        profile=json.dumps({"num_rows": ref.rows}),
                    ),
                    tags=[InputTag("mlflow.data.context", "training")],
                )
                for name, ref in tables
            ]
            self.client.log_inputs(mlflow_run, datasets=inputs)
        ckpt = manifest.outputs.get("checkpoint") if manifest.stage == "train" else None
        name = f"policy-{manifest.run_id}-iter-{k:04d}"
        if ckpt is not None and missing_only:
            found = self.client.search_logged_models([self.experiment_id], filter_string=f"name = '{name}'")
            ckpt = None if found else ckpt
        if ckpt is not None:
            model = self.client.create_logged_model(
                self.experiment_id,
                name=name,
                source_run_id=mlflow_run,
                tags={"store_uri": ckpt.uri, "policy_sha256": str(manifest.metrics.get("policy_sha256", ""))},
            )
            self.client.finalize_logged_model(model.model_id, "READY")

    def promote(
        self, name: str, run_id: str, iteration: int, checkpoint: Any, metrics: dict[str, Any]
    ) -> str | None:
        """Register ``checkpoint`` (a train stage's output, in the store) as a version of the registered model
        ``name``, tagged with its run, iteration, digest and held-out accuracy; alias ``newest``, and
        ``champion`` when its accuracy is the best of the model's versions. A checkpoint already registered
        (a resumed run finishing again) is not registered twice. Returns the version; None where an MLflow
        server refuses a local store's path (it registers only sources it can reach: an S3 store's)."""

        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # (it exists)
            self.client.create_registered_model(name)
        digest = checkpoint.sha256
        found = self.client.search_model_versions(f"name='{name}' and tags.checkpoint_sha256='{digest}'")
        if found:
            return found[0].version
        acc = metrics.get("accuracy")
        tags = {"rlfoundry.run_id": run_id, "iteration": str(iteration), "checkpoint_sha256": digest}
        tags |= {"eval_accuracy": str(acc)} if acc is not None else {}
        try:
            version = self.client.create_model_version(name, source=checkpoint.uri, tags=tags).version
        except MlflowException as e:  # a remote server registers no path on this machine (a local store's)
            if not checkpoint.uri.startswith("file://"):
                raise
            said = "MLflow did not register %s (%s): the final policy stays in the store"
            log.warning(said, checkpoint.uri, e)
            return None
        self.client.set_registered_model_alias(name, "newest", version)  # ("latest" is MLflow's own)
        accs = [
            float(v.tags["eval_accuracy"])
            for v in self.client.search_model_versions(f"name='{name}'")
            if v.tags.get("eval_accuracy") not in (None, "None")
        ]
        if acc is not None and acc >= max(accs, default=acc):
            self.client.set_registered_model_alias(name, "champion", version)
        return version

    def log_summary(self, parent: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Iterations' summary metrics on the experiment's run, each at its iteration as step: one
        ``log_batch`` for all of them (~15-20 ms on SQLite whatever it holds) up to MLflow's 1,000 a call."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(k), float(v), now, step) for step, row in rows for k, v in row.items()]
        for c in range(0, len(metrics), 1000):
            self.client.log_batch(parent, metrics=metrics[c : c + 1000])

    def link(self, run: str) -> str:
        """Where to open ``run``: its page when the tracking server is one (http), else its id and store."""
        uri = self.client.tracking_uri
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run}"
        return f"{run} ({uri})"

    def finish(self, run: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run, status)
