"""`ablate export CHECKPOINT --hf DIR`: a checkpoint as a transformers model (safetensors, config, tokenizer)."""

from __future__ import annotations

from ablate.cli.options import PATH, one_line_errors, text


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a checkpoint as a transformers model (safetensors + config + tokenizer)"
    )
    parser.add_argument("checkpoint", type=PATH, help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    parser.add_argument(
        "--hf", required=True, metavar="DIR", type=text("a folder, new or empty"), help="output folder, new or empty"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR, replacing the files the export writes (says which)",
    )
    parser.set_defaults(func=cmd_export)


@one_line_errors
def cmd_export(args) -> int:
    from ablate.eval.export import export_hf  # torch: imported only when the command runs

    _load_user_components(args.checkpoint)
    replaced, kept = export_hf(args.checkpoint, args.hf, force=args.force)
    print(f"wrote a transformers model to {args.hf}")
    if replaced:
        print(f"--force: replaced {len(replaced)} existing file(s): {', '.join(replaced)}")
    if kept:
        print(f"--force: left {len(kept)} other entr{'ies' if len(kept) > 1 else 'y'} as they were: {', '.join(kept)}")
    return 0


def _load_user_components(path) -> None:
    """Run the experiment file the run records (RunConfig.experiment_file), so that export finds its components
    registered: refused by name, or written as the shipped component they declare (hf_mapping). A file that is
    gone leaves them unregistered, and export refuses them saying so."""
    from ablate.eval.load import read_run_config
    from ablate.setup.experiment import load_recorded

    if read_run_config(path).user_code:  # a run of shipped components needs no file
        load_recorded(path)
