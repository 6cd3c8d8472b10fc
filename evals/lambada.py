"""LAMBADA (OpenAI's test set, 5153 items): a passage from a novel whose final word is easy to guess from the
whole passage and hard from its last sentence alone; the model scores that word after the passage (zero-shot, the
oe-eval request file's "lambada:bpb"). One continuation, no choices: bits per byte of the word (primary: continuous,
as OLMo's small-model suites score it; whole-word greedy accuracy stays near 0 for models this small) and
final-word accuracy (acc_greedy: every token of the word is the model's argmax; chance 0)."""

from ablate.eval.tasks import Item, Task


def build(row: dict, index: int) -> Item:
    context, word = row["contexts"][0], row["continuations"][0]
    return Item(
        id=row["native_id"],
        contexts=[context],
        continuations=[word],
        gold=0,
        question=context,
        choice_texts=[word.strip()],
    )


TASK = Task(
    name="lambada",
    data="oe_eval_tasks/lambada/bpb_0shot",
    build=build,
    primary="gold_bpb",
    kind="continuation",
    description=__doc__,
)
