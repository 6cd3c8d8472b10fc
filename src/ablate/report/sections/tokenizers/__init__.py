"""Runs of different tokenizers (report["tokenizers"]): what validation is compared by (loss, bits per byte, or left
out), and the runs table's tokenizer columns.

section.py  report["tokenizers"] from the runs: bits per byte where the tokenizers differ, on the same text only,
            and the tasks as compared (validation in bits per byte, or left out)
render.py   the runs table's tokenizer columns (val bpb, fertility, bytes per token)
"""
