"""CommonsenseQA (validation, 1221 items): commonsense questions with 5 choices; OLMES reports PMI accuracy. Its rows
have ARC's shape (choices with text and label, answerKey), so ARC's build reads them."""

from ablate.eval.tasks import Task

from ablate_evals.arc_easy import build

TASK = Task(
    name="commonsense_qa",
    data="tau/commonsense_qa/none/validation",
    build=build,
    primary="acc_pmi",
    description=__doc__,
)
