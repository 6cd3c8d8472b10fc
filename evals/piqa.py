"""PIQA (validation, 1838 items): physical commonsense, which of 2 solutions reaches the goal; OLMES: per-char."""

from ablate.eval.tasks import Task, question_answer_item


def build(row: dict, index: int):
    return question_answer_item(index, row["goal"], [row["sol1"], row["sol2"]], int(row["label"]))


TASK = Task(name="piqa", data="piqa/plain_text/validation", build=build, primary="acc_per_char", description=__doc__)
