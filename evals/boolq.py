"""BoolQ (validation, 3270 items): a yes/no question about a Wikipedia passage; OLMES: no normalization."""

from ablate.eval.tasks import Item, Task


def build(row: dict, index: int) -> Item:
    question = f"{row['passage'].strip()}\nQuestion: {row['question'].strip()}?"
    return Item(
        id=index,
        contexts=[f"{question}\nAnswer:"],
        continuations=[" no", " yes"],
        gold=int(str(row["answer"]) == "True"),
        question=question,
        choice_texts=["no", "yes"],
    )


TASK = Task(name="boolq", data="boolq/none/validation", build=build, primary="acc_raw", description=__doc__)
