"""The tracked runs a report or a study reads: the MLflow store, a study's FINISHED runs, their metric histories."""

from __future__ import annotations

import logging
from pathlib import Path

from rlx_cli.config.errors import UserError
from rlx_cli.loops.track import tracking_uri
from rlx_cli.studies.study import STUDY_NAME, STUDY_ROLE


def connect():
    import mlflow
    from mlflow.tracking import MlflowClient

    for noisy in ("alembic", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise UserError(f"no MLflow store at {uri} (set MLFLOW_TRACKING_URI to the store your runs went to)")
    mlflow.set_tracking_uri(uri)
    return mlflow, MlflowClient()


def load_runs(experiment: str | None, study: str | None) -> list:
    """The FINISHED ``rlx train`` runs of the experiment and/or study; a one-line error names what exists."""
    mlflow, client = connect()
    experiments = sorted(e.name for e in client.search_experiments())
    listing = f"experiments: {', '.join(experiments) or '(none)'}"
    if experiment is None and study is None:
        raise UserError(f"pass --experiment NAME or --study NAME ({listing})")
    ids = None
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise UserError(f"unknown experiment '{experiment}' at {tracking_uri()} ({listing})")
        ids = [found.experiment_id]
    filters = ["attributes.status = 'FINISHED'"]
    if study is not None:
        if not STUDY_NAME.match(study):
            raise UserError(f"--study '{study}' is not a valid name (valid: letters, digits, '_', '-', '.')")
        filters.append(f"tags.`rlx.study` = '{study}'")
    query = " and ".join(filters)
    runs = mlflow.search_runs(ids, query, search_all_experiments=ids is None, output_format="list")
    runs = [r for r in runs if r.data.tags.get("rlx.role") != STUDY_ROLE and "rlx.overrides" in r.data.tags]
    if not runs:
        parents = mlflow.search_runs(
            search_all_experiments=True, filter_string=f"tags.`rlx.role` = '{STUDY_ROLE}'", output_format="list"
        )
        studies = sorted({r.data.tags.get("rlx.study", "") for r in parents} - {""})
        where = " and ".join(f"{k} '{v}'" for k, v in (("experiment", experiment), ("study", study)) if v)
        raise UserError(f"no FINISHED runs in {where} ({listing}; studies: {', '.join(studies) or '(none)'})")
    return runs


def load_failed(experiment: str | None, study: str | None) -> list:
    """The FAILED ``rlx train`` runs of the experiment and/or study (``load_runs`` checked the names)."""
    mlflow, client = connect()
    ids = None if experiment is None else [client.get_experiment_by_name(experiment).experiment_id]
    filters = ["attributes.status = 'FAILED'"] + ([f"tags.`rlx.study` = '{study}'"] if study is not None else [])
    runs = mlflow.search_runs(ids, " and ".join(filters), search_all_experiments=ids is None, output_format="list")
    return [r for r in runs if r.data.tags.get("rlx.role") != STUDY_ROLE and "rlx.overrides" in r.data.tags]


def seeds_of(runs: list, seeds: str | None) -> list:
    """The runs of ``--seeds`` (all without it), with no error when none is left."""
    wanted = None if seeds is None else {s.strip() for s in seeds.split(",")}
    return [r for r in runs if wanted is None or r.data.tags.get("rlx.seed") in wanted]


def only_seeds(runs: list, seeds: str | None) -> list:
    """``--seeds 0,1,2``: the runs of those seeds (so that arms run with more seeds compare on the same ones)."""
    if seeds is None:
        return runs
    wanted = {s.strip() for s in seeds.split(",") if s.strip()}
    if not wanted or not all(s.isdigit() for s in wanted):
        raise UserError(f"--seeds {seeds} is not valid (valid: seeds separated by commas, e.g. 0,1,2)")
    kept = [r for r in runs if r.data.tags.get("rlx.seed") in wanted]
    if not kept:
        found = sorted({r.data.tags.get("rlx.seed", "?") for r in runs})
        raise UserError(f"--seeds {seeds}: no FINISHED run has these seeds (seeds found: {', '.join(found)})")
    return kept


def histories(client, runs: list, metrics: list[str]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(run_id, metric) -> [(step, value)] sorted by step, the last write of a step winning."""
    out = {}
    for run in runs:
        for metric in metrics:
            points = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: (m.step, m.timestamp))
            out[run.info.run_id, metric] = list({m.step: m.value for m in points}.items())
    return out
