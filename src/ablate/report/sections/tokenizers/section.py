"""report["tokenizers"]: runs of different tokenizers. Loss per token does not compare across them (a token holds
more text under a larger vocabulary), bits per byte does. When the finished runs use more than one tokenizer,
validation is compared by its bits per byte (the val/bpb lines every run logs beside val/loss) and the report says
so; validation is left out where its figures do not compare (inputs/tokenizers.py says which runs scored what).
"""

from __future__ import annotations

import dataclasses

from ablate.report.inputs import tokenizers
from ablate.report.inputs.runs import VAL_TASK, Run, TaskInfo
from ablate.report.schema.runs import Tokenizers
from ablate.text import natural_key


def tokenizers_section(runs: list[Run], tasks: dict[str, TaskInfo]) -> tuple[Tokenizers, dict[str, TaskInfo]]:
    """When the finished runs use several tokenizers, validation is compared in bits per byte: the val task's one
    metric becomes "bpb" (left out when some run logged none, or the runs did not score the same text: the reason
    in the text). Validation is left out whatever the tokenizers where the runs mix its two definitions
    (inputs/tokenizers.mixed_validation). Returns report.json's "tokenizers" record and the tasks as compared, a new
    mapping (`tasks` and its TaskInfos are left as they were)."""
    ids = tokenizers.identities(runs)
    kinds = sorted({tokenizers.tokenizer_label(r) for r in runs if r.label in ids}, key=natural_key)
    differ = len(set(ids.values())) > 1

    def note(compared_by: str | None, text: str = "") -> Tokenizers:
        return Tokenizers(differ=differ, tokenizers=kinds, compared_by=compared_by, text=text)

    mixed = tokenizers.mixed_validation(runs) if VAL_TASK in tasks else None
    if mixed:  # whatever the tokenizers: two definitions of validation never compare
        return note(None, f"Validation is left out of the comparison: {mixed}."), _without_val(tasks)
    if not differ or VAL_TASK not in tasks:
        return note("loss"), dict(tasks)
    finished = [r for r in runs if r.label in ids]
    without = [r.label for r in finished if not r.scores.get((VAL_TASK, tokenizers.BPB))]
    head = f"Runs of {len(set(ids.values()))} tokenizers ({', '.join(kinds)})"
    other_text = tokenizers.different_text(runs)
    if without or other_text:
        why = f"{', '.join(without)} logged no val/bpb (trained before ablate logged it)" if without else other_text
        text = (
            f"{head}: loss per token does not compare across tokenizers and {why}, so validation is left out of "
            f"the comparison."
        )
        return note(None, text), _without_val(tasks)
    text = (
        f"{head}: validation is compared in bits per byte (val_bpb = loss x tokens / UTF-8 bytes / ln 2), since "
        f"loss per token does not compare across tokenizers; every run scored the same validation text; on run "
        f"scores alone, as a sequence holds other tokens under each tokenizer."
    )
    in_bpb = dataclasses.replace(tasks[VAL_TASK], metrics=[tokenizers.BPB], primary=tokenizers.BPB, chance=None)
    return note(tokenizers.BPB, text), {**tasks, VAL_TASK: in_bpb}


def _without_val(tasks: dict[str, TaskInfo]) -> dict[str, TaskInfo]:
    return {key: info for key, info in tasks.items() if key != VAL_TASK}
