"""basic_skills (OLMo 3's small-model suite): six skills, each a short prompt completed by one of 4-10 choices after
5 solved examples of the same skill; OLMES reports per-token accuracy. Items and both renderings come from the
oe-eval request files: CF scores each choice's text after the rc_5shot context, MCF the letter after the mc_5shot
context (the same examples and question with lettered choices)."""

from functools import cache

from ablate.eval.tasks import LETTERS, REQUESTS_PREFIX, Item, Task, load_rows

SKILLS = {  # name -> what an item asks, for its description
    "arithmetic": 'the value of an expression ("4 * 8 ="), 10 choices',
    "coding": "the return expression of a short Python function, 4-5 choices",
    "common_knowledge": 'an everyday fact ("The number of legs of a cat is"), 4-6 choices',
    "logical_reasoning": "the conclusion of a syllogism, 4 choices",
    "pattern": 'the next element of a sequence ("2 4 6 8"), 4-5 choices',
    "string_operations": "the result of a string operation (\"The length of the string 'hello' is\"), 4-6 choices",
}


@cache
def mcf_contexts(skill: str) -> dict[str, str]:
    """native_id -> the mc_5shot context (its 5 examples, then the question and its lettered choices)."""
    return {
        row["native_id"]: row["contexts"][0] for row in load_rows(f"{REQUESTS_PREFIX}basic_skills_{skill}/mc_5shot")
    }


def builder(skill: str):
    def build(row: dict, index: int) -> Item:
        doc, item_id = row["doc"], row["native_id"]
        if len(set(row["contexts"])) != 1:
            raise ValueError(f"basic_skills_{skill} {item_id}: choices with different contexts")
        # render(item, "mcf") appends these lines to `question`: cut them from the mc_5shot context to get it
        listed = "".join(f"\n {LETTERS[i]}. {text}" for i, text in enumerate(doc["choices"])) + "\nAnswer:"
        mcf = mcf_contexts(skill)[item_id]
        if not mcf.endswith(listed):
            raise ValueError(f"basic_skills_{skill} {item_id}: the mc_5shot context does not end in its choices")
        return Item(
            id=item_id,
            contexts=row["contexts"][:1],
            continuations=row["continuations"],
            gold=int(doc["gold"]),
            question=mcf[: -len(listed)],
            choice_texts=list(doc["choices"]),
        )

    return build


TASKS = [
    Task(
        name=f"basic_skills_{skill}",
        data=f"{REQUESTS_PREFIX}basic_skills_{skill}/rc_5shot",
        build=builder(skill),
        primary="acc_per_token",
        description=f"basic_skills {skill.replace('_', ' ')}: {asks}, 5-shot.\n\n{__doc__}",
    )
    for skill, asks in SKILLS.items()
]
