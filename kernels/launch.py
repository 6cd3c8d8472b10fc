"""How a Triton kernel is launched from a torch.library.triton_op's body, in one place for every kernel module."""

from __future__ import annotations

import torch


def traced(kernel):
    """`kernel` as a triton_op's body launches it (traced(kernel)[grid](...)): torch.library.wrap_triton's wrapper,
    which torch.compile records as a triton_kernel_wrapper node of its graph. Under Triton's interpreter the kernel
    itself: an interpreted kernel cannot be traced, and older torch's wrap_triton refuses one even in eager."""
    from triton.runtime.jit import JITFunction

    return torch.library.wrap_triton(kernel) if isinstance(kernel, JITFunction) else kernel
