"""The coordinate check (Tensor Programs V, section 7): does each layer's activation size stay put as the model widens?

    python scripts/check_transfer.py experiments/mup_transfer.py
    python scripts/check_transfer.py FILE --widths 32,64,128,256 --steps 8 --lr 0.01 --out coord_check
    python scripts/check_transfer.py FILE --random-tokens        # no data preparation: uniform random tokens
    python scripts/check_transfer.py FILE --set data.source=/data/wiki-00.jsonl.gz    # as ablate run's --set

The first run of FILE (or --only's) is built at each width under each parametrization ("sp" and "mup" unless
--parametrizations says), from one seed, and trained --steps steps at a constant lr (the run's optim.lr unless
--lr). Before each step the RMS of the embedding's output, of each block's output (the residual stream) and of the
logits is recorded on the step's batch. Under μP the curves lie flat across width; under the standard
parametrization they grow, the logits fastest (Adam's update moves a width-n dot product about n times as far).

It prints, per parametrization and activation, the RMS at the last step at each width and the slope of log2 RMS
against log2 width (0: flat; 1: doubling with each doubling of width), and writes coord_check.json and
coord_check.png under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ablate.config import RunConfig  # noqa: E402
from ablate.model import Transformer  # noqa: E402
from ablate.optim import build_optimizer, set_lr  # noqa: E402


@dataclass(frozen=True)
class CoordinateCheck:
    """rms[parametrization][activation][i_width] = one RMS per step (before that step's update)."""

    widths: list[int]
    steps: int
    lr: float
    rms: dict[str, dict[str, list[list[float]]]]

    def slope(self, parametrization: str, activation: str, step: int = -1) -> float:
        """The least-squares slope of log2 RMS against log2 width at `step` (the last by default)."""
        values = [per_step[step] for per_step in self.rms[parametrization][activation]]
        return float(np.polyfit(np.log2(self.widths), np.log2(values), 1)[0])


def activation_names(n_layers: int) -> list[str]:
    return ["embed", *(f"layer{i}" for i in range(n_layers)), "logits"]


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


def _record(model: Transformer, tokens: torch.Tensor) -> dict[str, float]:
    """The RMS of each activation of one forward of `tokens`, without gradients."""
    seen = {}
    hooks = [model.embed.register_forward_hook(lambda m, i, out: seen.__setitem__("embed", _rms(out)))]
    for index, layer in enumerate(model.layers):
        hooks.append(layer.register_forward_hook(lambda m, i, out, k=index: seen.__setitem__(f"layer{k}", _rms(out))))
    try:
        with torch.no_grad():
            seen["logits"] = _rms(model(tokens))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def check(
    run: RunConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    widths: list[int],
    parametrizations: list[str],
    lr: float,
    seed: int = 0,
) -> CoordinateCheck:
    """Train `run`'s model at each width under each parametrization on `batches` (inputs, targets), one step
    each, recording every activation's RMS before each step. mup's base_width: the run's, else the narrowest."""
    steps = len(batches)
    names = activation_names(run.model.n_layers)
    rms: dict[str, dict[str, list[list[float]]]] = {}
    for name in parametrizations:
        rms[name] = {activation: [] for activation in names}
        for width in widths:
            model_cfg = dataclasses.replace(
                run.model, d_model=width, parametrization=name, base_width=run.model.base_width or min(widths)
            )
            model = Transformer(model_cfg, run.data.seq_len)
            model.init_weights(torch.Generator().manual_seed(seed))
            optimizer = build_optimizer(model, run.optim, model.base_shapes())
            set_lr(optimizer, lr)
            per_step = {activation: [] for activation in names}
            for inputs, targets in batches:
                for activation, value in _record(model, inputs).items():
                    per_step[activation].append(value)
                loss, _ = model.loss(inputs, targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for activation in names:
                rms[name][activation].append(per_step[activation])
    return CoordinateCheck(widths=list(widths), steps=steps, lr=lr, rms=rms)


def random_batches(vocab: int, batch: int, seq_len: int, steps: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (steps, batch, seq_len + 1), generator=generator)
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def data_batches(run: RunConfig, batch: int, steps: int, seed: int = 0):
    """`steps` batches of the run's own training data (prepared as `ablate run` prepares it)."""
    from ablate.data.prepare import prepare_data

    data = prepare_data(run.data, run.model.vocab_size, global_batch=batch)
    sampler = data.sampler(run.data.seq_len, seed)
    return [data.train.batch(sampler.take(batch), run.data.seq_len)[:2] for _ in range(steps)]


def report(result: CoordinateCheck) -> str:
    lines = [f"coordinate check: widths {result.widths}, {result.steps} steps at lr {result.lr:g}"]
    for name, by_activation in result.rms.items():
        lines.append(f"\n{name}: RMS at step {result.steps - 1} by width; slope of log2 RMS on log2 width")
        for activation, per_width in by_activation.items():
            values = "  ".join(f"{per_step[-1]:9.4g}" for per_step in per_width)
            lines.append(f"  {activation:>8}  {values}   slope {result.slope(name, activation):+.2f}")
    return "\n".join(lines)


def plot(result: CoordinateCheck, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.rms)
    activations = list(next(iter(result.rms.values())))
    # the embedding, the first and last blocks, the logits (each once, however few the layers)
    shown = list(dict.fromkeys([activations[0], activations[1], activations[-2], activations[-1]]))
    figure, axes = plt.subplots(len(names), len(shown), figsize=(3.2 * len(shown), 2.8 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for column, activation in enumerate(shown):
            axis = axes[row][column]
            per_width = np.array(result.rms[name][activation])  # (widths, steps)
            for step in range(result.steps):
                axis.plot(result.widths, per_width[:, step], marker="o", color=plt.cm.viridis(step / result.steps))
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_title(f"{name}: {activation} (slope {result.slope(name, activation):+.2f})", fontsize=9)
            axis.set_xlabel("d_model")
        axes[row][0].set_ylabel("RMS (a line per step, dark first)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="an experiment file: its first run (or --only's) is the model checked")
    parser.add_argument("--only", default=None, help="the variant to check (a name or glob); default: the first")
    parser.add_argument("--widths", default="32,64,128,256", help="d_model values, comma-separated (4 or more)")
    parser.add_argument("--parametrizations", default="sp,mup")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=None, help="constant lr; default: the run's optim.lr")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--random-tokens", action="store_true", help="uniform random tokens, not the run's data")
    parser.add_argument("--out", default="coord_check", help="folder for coord_check.json and coord_check.png")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="as ablate run's")
    args = parser.parse_args(argv)

    from ablate.config import ConfigError, ExperimentError
    from ablate.setup.experiment import load_experiment

    try:
        widths = [int(w) for w in args.widths.split(",")]
        if len(widths) < 4 or any(w <= 0 for w in widths):
            raise ValueError
    except ValueError:
        print(f"--widths: {args.widths!r}; allowed: 4 or more positive d_model values, e.g. 32,64,128,256")
        return 2
    overrides = dict(item.split("=", 1) for item in args.set if "=" in item)
    if len(overrides) != len(args.set):
        print(f"--set: {args.set}; allowed: SECTION.FIELD=VALUE, e.g. data.source=/data/wiki.jsonl.gz")
        return 2
    try:
        runs = load_experiment(args.file, only=args.only, overrides=overrides)
    except (ConfigError, ExperimentError) as error:
        print(error)
        return 2
    run = runs[0]
    lr = args.lr if args.lr is not None else run.optim.lr
    if args.random_tokens:
        batches = random_batches(run.model.vocab_size, args.batch, run.data.seq_len, args.steps, run.train.seed)
    else:
        batches = data_batches(run, args.batch, args.steps, run.train.seed)
    result = check(run, batches, widths, args.parametrizations.split(","), lr, run.train.seed)
    print(report(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coord_check.json").write_text(json.dumps(dataclasses.asdict(result), indent=1))
    plot(result, out / "coord_check.png")
    print(f"\nwrote {out / 'coord_check.json'} and {out / 'coord_check.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
