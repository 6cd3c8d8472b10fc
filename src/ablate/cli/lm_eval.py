"""`ablate-lm-eval` (or `python -m ablate.cli.lm_eval`): lm-eval's own CLI with ablate's model registered and
ablate's task configs (evals/lm_eval_tasks) on the include path unless one is given."""

from __future__ import annotations

import sys


def main() -> None:
    import ablate.eval.lm_eval_model  # noqa: F401  registers --model ablate
    from ablate_evals.lm_eval_tasks import PATH
    from lm_eval.__main__ import cli_evaluate

    if not any(a.startswith("--include_path") for a in sys.argv[1:]):
        sys.argv[1:] = ["--include_path", str(PATH), *sys.argv[1:]]
    cli_evaluate()


if __name__ == "__main__":
    main()
