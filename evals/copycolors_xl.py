"""CopyColors XL (10-way, 1000 items): copycolors' 100 questions, each with its choices rotated to put the answer
at every letter once (oe-eval's cyclic variants), so a bias toward one letter scores exactly chance; raw accuracy."""

from ablate.eval.tasks import Task

from ablate_evals.copycolors import build

TASK = Task(
    name="copycolors_xl", data="oe_eval_tasks/copycolors/xl_10way", build=build, primary="acc_raw", description=__doc__
)
