"""HellaSwag (validation, 10042 items): pick the plausible ending of an activity description, 4 choices; OLMES
reports per-char accuracy. The text is cleaned of WikiHow markup ("[title]", "[header]") as lm-eval does."""

import re

from ablate.eval.tasks import Item, Task, literal


def clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def build(row: dict, index: int) -> Item:
    context = clean(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    endings = [clean(e) for e in literal(row["endings"])]
    return Item(
        id=index,
        contexts=[context],
        continuations=[f" {e}" for e in endings],
        gold=int(row["label"]),
        question=context,
        choice_texts=endings,
    )


TASK = Task(
    name="hellaswag", data="hellaswag/none/validation", build=build, primary="acc_per_char", description=__doc__
)
