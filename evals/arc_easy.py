"""ARC-Easy (validation, 570 items): grade-school science questions, 3-5 choices; OLMES reports per-char accuracy."""

from ablate.eval.tasks import Task, literal, question_answer_item


def build(row: dict, index: int):
    choices = literal(row["choices"])
    return question_answer_item(row["id"], row["question"], choices["text"], choices["label"].index(row["answerKey"]))


TASK = Task(
    name="arc_easy", data="ai2_arc/ARC-Easy/validation", build=build, primary="acc_per_char", description=__doc__
)
