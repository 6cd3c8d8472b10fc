"""Functions the ablate lm-eval task configs call: the items come from ablate's own task definitions."""

import datasets

from ablate.eval.tasks import render


def load(task: str, format: str = "cf", **_) -> datasets.DatasetDict:
    """All items of `task`, in ablate's fixed subsample order, as one "test" split."""
    from ablate_evals import TASKS

    docs = []
    for item in TASKS[task].items(limit=None):
        contexts, continuations = render(item, format)
        docs.append({"id": str(item.id), "contexts": contexts, "continuations": continuations, "gold": item.gold})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# A task whose choices differ in their context (WinoGrande's partial scoring) is what lm-eval calls multiple-input:
# doc_to_text gives the gold index, doc_to_choice the contexts, doc_to_target the shared continuation.
def doc_to_text(doc):
    return doc["contexts"][0] if len(doc["contexts"]) == 1 else doc["gold"]


def doc_to_choice(doc):
    return doc["continuations"] if len(doc["contexts"]) == 1 else doc["contexts"]


def doc_to_target(doc):
    return doc["gold"] if len(doc["contexts"]) == 1 else doc["continuations"][0]


def continuation(doc):
    """The target of a continuation task (output_type loglikelihood: LAMBADA's final word)."""
    return doc["continuations"][0]
