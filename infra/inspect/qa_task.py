"""The built-in inspect-ai task of ``eval.inspect`` (``task: qa``): a local question/answer dataset, one
generation per question, scored by inspect-ai's own ``match`` scorer (the target at the end of the answer,
numbers compared as numbers) or ``includes``. It runs inside the harness's environment
(infra/inspect/requirements.txt), never in rlfoundry's: it imports inspect-ai alone.

    inspect eval infra/inspect/qa_task.py -T dataset=heldout.jsonl -T scorer=match --model ...

The dataset is JSON lines (or CSV) with ``input`` and ``target`` (and optionally ``id``); ``dataset: heldout``
in the config writes the run's held-out problems in that form.
"""

from inspect_ai import Task, task
from inspect_ai.dataset import csv_dataset, json_dataset
from inspect_ai.scorer import includes, match
from inspect_ai.solver import generate

SCORERS = {"match": match, "includes": includes}


@task
def qa(dataset: str, scorer: str = "match") -> Task:
    if scorer not in SCORERS:
        raise ValueError(f"scorer {scorer!r}: must be one of {sorted(SCORERS)}")
    read = csv_dataset if dataset.endswith(".csv") else json_dataset
    return Task(dataset=read(dataset), solver=generate(), scorer=SCORERS[scorer]())
