"""ARC-Challenge (validation, 299 items): the ARC questions that simple solvers miss; OLMES reports PMI accuracy."""

from ablate.eval.tasks import Task

from ablate_evals.arc_easy import build

TASK = Task(
    name="arc_challenge", data="ai2_arc/ARC-Challenge/validation", build=build, primary="acc_pmi", description=__doc__
)
