"""SocialIQA (validation, 1954 items): reasoning about people's motives and reactions, 3 choices; OLMES: per-char."""

from ablate.eval.tasks import Task, question_answer_item


def build(row: dict, index: int):
    return question_answer_item(
        index,
        f"{row['context']} {row['question']}",
        [row["answerA"], row["answerB"], row["answerC"]],
        int(row["label"]) - 1,
    )


TASK = Task(
    name="social_iqa", data="social_i_qa/none/validation", build=build, primary="acc_per_char", description=__doc__
)
