"""OpenBookQA (validation, 500 items): elementary science with 4 choices; OLMES reports PMI accuracy."""

from ablate.eval.tasks import Task, literal, question_answer_item


def build(row: dict, index: int):
    choices = literal(row["choices"])
    return question_answer_item(
        row["id"], row["question_stem"], choices["text"], choices["label"].index(row["answerKey"])
    )


TASK = Task(name="openbookqa", data="openbookqa/main/validation", build=build, primary="acc_pmi", description=__doc__)
