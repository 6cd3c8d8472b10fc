"""COPA (validation, 100 items): the cause or effect of a premise, 2 choices; the premise ends in "because" or
"therefore" and each choice continues it (lower-cased), as in lm-eval; raw accuracy."""

from ablate.eval.tasks import Item, Task

CONNECTOR = {"cause": "because", "effect": "therefore"}


def build(row: dict, index: int) -> Item:
    premise = row["premise"].strip()
    choices = [row["choice1"], row["choice2"]]
    return Item(
        id=int(row["idx"]),
        contexts=[f"{premise.rstrip('.')} {CONNECTOR[row['question']]}"],
        continuations=[f" {c[0].lower()}{c[1:]}" for c in choices],
        gold=int(row["label"]),
        question=f"{premise} What was the {row['question']}?",
        choice_texts=choices,
    )


TASK = Task(name="copa", data="super_glue/copa/validation", build=build, primary="acc_raw", description=__doc__)
