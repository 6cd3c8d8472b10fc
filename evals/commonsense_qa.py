"""CommonsenseQA (validation, 1221 items): commonsense questions with 5 choices; OLMES reports PMI accuracy."""
from ablate.eval.tasks import Task, literal, question_answer_item


def build(row: dict, index: int):
    choices = literal(row["choices"])
    return question_answer_item(row["id"], row["question"], choices["text"], choices["label"].index(row["answerKey"]))


TASK = Task(name="commonsense_qa", data="tau/commonsense_qa/none/validation", build=build, primary="acc_pmi",
            description=__doc__)
