"""An adaptive study's record under a runs folder: study.json as the driver (launch/study.py) wrote it. Its rule is
checked where it is understood (sections/sequential/section.read_study)."""

from __future__ import annotations

import json
from pathlib import Path

from ablate.rundir import STUDY


def study_path(runs_dir) -> Path:
    return Path(runs_dir) / STUDY


def read_study(runs_dir) -> dict | None:
    """runs_dir/study.json, or None where there is no study. Raises ValueError naming the file when it is not JSON
    or holds no rule."""
    path = study_path(runs_dir)
    if not path.is_file():
        return None
    try:
        study = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a study record ({exc})") from None
    if not isinstance(study, dict) or "rule" not in study:
        raise ValueError(f"{path}: not a study record (no 'rule')")
    return study
