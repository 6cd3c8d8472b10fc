"""CopyColors (10-way, 100 items): "Yoghurt is white. What color is yoghurt?" with 10 lettered colors after 3
solved examples; the answer is in the question, so it measures whether the model has learned the multiple-choice
format at all. Scored as the oe-eval request file asks: its 3-shot context, then each letter " A".." J"; raw accuracy.
The task is multiple-choice in either format (CF and MCF give the same requests)."""

from ablate.eval.tasks import Item, Task

CHOICES_START = "\n A. "  # where the lettered choices start in a document's query


def build(row: dict, index: int) -> Item:
    doc = row["doc"]
    context, query = row["contexts"][0], doc["query"]
    listed = query[query.index(CHOICES_START) :].removesuffix("\nAnswer:")
    choice_texts = [line.split(". ", 1)[1] for line in listed.strip("\n").split("\n")]
    # MCF's rendering of question + choice_texts is the request's context, so both formats score the same requests
    question = context[: len(context) - len(query)] + query[: query.index(CHOICES_START)]
    return Item(
        id=row["native_id"],
        contexts=[context],
        continuations=row["continuations"],
        gold=int(doc["gold"]),
        question=question,
        choice_texts=choice_texts,
    )


TASK = Task(
    name="copycolors", data="oe_eval_tasks/copycolors/10way", build=build, primary="acc_raw", description=__doc__
)
