"""ARC-Challenge (test, 1172 items): arc_challenge's questions from the larger test split, zero-shot as
arc_challenge is; PMI accuracy (OLMES). Read as arc_easy_test is, from the test split's oe-eval request file."""

from ablate.eval.tasks import Task

from ablate_evals.arc_easy_test import build

TASK = Task(
    name="arc_challenge_test",
    data="oe_eval_tasks/arc_challenge/test_rc_5shot",
    build=build,
    primary="acc_pmi",
    description=__doc__,
)
