"""SciQ (validation, 1000 items): science questions after a support paragraph, 4 choices; per-char accuracy. The
data lists the answer last, so choices are put in a fixed order of the item's own (it matters for MCF)."""

from dataclasses import replace

from ablate.eval.tasks import Task, question_answer_item, stable_shuffle


def build(row: dict, index: int):
    choices, gold = stable_shuffle(
        [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]], 3, row["question"]
    )
    item = question_answer_item(index, row["question"], choices, gold)
    support = row["support"].strip()
    if not support:
        return item
    return replace(item, contexts=[f"{support}\n{c}" for c in item.contexts], question=f"{support}\n{item.question}")


TASK = Task(name="sciq", data="sciq/none/validation", build=build, primary="acc_per_char", description=__doc__)
