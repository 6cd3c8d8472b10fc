"""A run's identity cannot drift by accident: which fields make it is declared in each config section (config.py's
`identity_omits`, `identity_added_later`, `identity_as`), and the identities of representative configs are pinned
here (tests/golden/identities.json, written by the code as it stood when run folders of each kind existed), so a new
field, or a changed default, that would change the identity of every existing run folder (no longer resumed, no
longer recognised as finished) fails with the field's name.

A deliberate change of the pinned identities (rare: every earlier folder is orphaned) rewrites the file with
`python tests/test_identity.py --write`, and says so in its commit.
"""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from ablate.config import SECTIONS, RunConfig
from ablate.setup.overrides import apply_overrides

GOLDEN = Path(__file__).parent / "golden" / "identities.json"

# One config of each kind a run folder holds: the defaults, every section moved off its defaults, the fields added
# after run folders existed both at and off their defaults, a branch, a grid run, "auto" and explicit choices.
REPRESENTATIVE = {
    "defaults": {},
    "names, bookkeeping and eval differ": {
        "train.log_every": 1,
        "train.val_every": 7,
        "train.ckpt_every": 3,
        "train.keep_checkpoints": 5,
        "train.peak_flops": 1e12,
        "train.monitor_every": 2,
        "train.keep_steps": [4, 8],
        "data.cache_dir": "/tmp/elsewhere",
        "data.val_sequences": 9,
        "eval.tasks": "arc_easy",
        "eval.limit": 50,
    },
    "small dense, explicit choices": {
        "model.vocab_size": 512,
        "model.d_model": 32,
        "model.n_layers": 2,
        "model.n_kv_heads": 1,
        "model.ffn": "gelu",
        "model.qk_norm": True,
        "model.kernels": "triton",
        "data.seq_len": 32,
        "data.max_documents": 400,
        "optim.lr": 1e-3,
        "schedule.name": "wsd",
        "train.max_steps": 12,
        "train.global_batch": 8,
        "train.micro_batch": 4,
        "train.compile": True,
        "train.dtype": "bf16",
        "train.seed": 3,
    },
    "moe, mla and muon (fields added later, off their defaults)": {
        "model.ffn": "moe",
        "model.moe_experts": 4,
        "model.moe_top_k": 1,
        "model.moe_shared_experts": 1,
        "model.moe_balance": "bias",
        "model.moe_capacity": 1.25,
        "model.attention": "mla",
        "model.kv_lora_rank": 32,
        "model.q_lora_rank": 16,
        "optim.name": "muon",
        "optim.momentum": 0.9,
        "optim.ns_steps": 4,
        "optim.hidden_lr_scale": 2.0,
        "optim.head_lr_scale": 0.5,
    },
    "batch schedule, max tokens and spike policy (added later)": {
        "train.batch_schedule": "ramp",
        "train.global_batch": 32,
        "train.micro_batch": 4,
        "train.batch_start": 8,
        "train.batch_ramp_tokens": 4096,
        "train.batch_lr_scaling": "sqrt",
        "train.max_tokens": 65536,
        "train.spike_policy": "rollback",
        "train.spike_window": 20,
        "train.spike_threshold": 5.0,
        "train.compile": False,
        "model.kernels": "torch",
    },
}


def representative() -> dict[str, RunConfig]:
    configs = {label: apply_overrides(RunConfig(), overrides) for label, overrides in REPRESENTATIVE.items()}
    grid_run = apply_overrides(RunConfig(experiment="sweep", name="lr0.001"), {"optim.lr": 1e-3})
    configs["a grid run"] = dataclasses.replace(grid_run, axes={"optim.lr": 1e-3})
    branch = apply_overrides(RunConfig(experiment="wsd", name="decay_at_100"), {"schedule.name": "wsd"})
    configs["a branch"] = dataclasses.replace(
        branch, branch={"parent": "stable", "at": 0.5, "step": 100, "tokens": 409600, "parent_identity": "0123abcd4567"}
    )
    return configs


def flat(fields: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in fields.items():
        if isinstance(value, dict) and (prefix + key) in SECTIONS:
            out.update(flat(value, f"{key}."))
        else:
            out[prefix + key] = value
    return out


def pinned() -> dict:
    return {
        label: {"identity": run.identity(), "fields": run.identity_fields()} for label, run in representative().items()
    }


@pytest.mark.parametrize("label", list(REPRESENTATIVE) + ["a grid run", "a branch"])
def test_identities_of_representative_configs_are_pinned(label):
    want = json.loads(GOLDEN.read_text())[label]
    run = representative()[label]
    have, had = flat(run.identity_fields()), flat(want["fields"])
    added = sorted(set(have) - set(had))
    assert not added, (
        f"{', '.join(added)} now in the identity of every run: declare it in its section's identity_added_later "
        f"(left out at its default, which must reproduce earlier runs) or identity_omits (never changes the numbers)"
    )
    removed = sorted(set(had) - set(have))
    assert not removed, f"{', '.join(removed)} left the identity: every earlier folder of such runs is orphaned"
    changed = sorted(k for k in have if have[k] != had[k])
    assert not changed, f"{', '.join(f'{k}: {had[k]!r} -> {have[k]!r}' for k in changed)} changed in the identity"
    assert run.identity() == want["identity"]


def test_bookkeeping_leaves_the_identity_alone():
    configs = representative()
    assert configs["defaults"].identity() == configs["names, bookkeeping and eval differ"].identity()
    assert configs["defaults"].identity() == apply_overrides(RunConfig(), {"train.compile": False}).identity()


def test_every_declared_name_is_a_field():
    for cls in (RunConfig, *SECTIONS.values()):
        names = {f.name for f in dataclasses.fields(cls)}
        declared = {*cls.identity_omits, *cls.identity_added_later, *cls.identity_as}
        assert declared <= names, f"{cls.__name__}: {sorted(declared - names)} are not fields"
        assert not set(cls.identity_omits) & set(cls.identity_added_later), cls.__name__


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(pinned(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
