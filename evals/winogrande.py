"""WinoGrande (validation, 1267 items): fill a blank with one of 2 names. Partial scoring: each option fills the
blank in the context and the rest of the sentence, the same for both, is the scored continuation; OLMES: raw."""

from ablate.eval.tasks import Item, Task


def build(row: dict, index: int) -> Item:
    sentence = row["sentence"]
    blank = sentence.index("_")
    options = [row["option1"], row["option2"]]
    rest = " " + sentence[blank + 1 :].strip()
    return Item(
        id=index,
        contexts=[sentence[:blank] + option for option in options],
        continuations=[rest, rest],
        gold=int(row["answer"]) - 1,
        question=f"Fill in the blank: {sentence}",
        choice_texts=options,
    )


TASK = Task(
    name="winogrande", data="winogrande/winogrande_xl/validation", build=build, primary="acc_raw", description=__doc__
)
