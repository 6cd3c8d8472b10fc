"""MMLU (test, 14042 items in 57 subjects): knowledge questions from elementary to professional level, 4 choices,
scored as cloze over the answer texts ("Question: ...\nAnswer:" then " <choice>", as OLMo's and OLMES's MMLU RC);
per-char accuracy (OLMES). Metrics are macro-averaged over subjects, and a limit takes about as many items of each."""

from ablate.eval.tasks import Task, question_answer_item


def build(row: dict, index: int):
    return question_answer_item(index, row["question"], row["choices"], int(row["answer"]))


TASK = Task(
    name="mmlu",
    data="hails/mmlu_no_train/*/test",
    build=build,
    primary="acc_per_char",
    description=__doc__,
    group=lambda row: row["subject"],
)
