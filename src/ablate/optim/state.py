"""What an optimizer declares about its memory, for `ablate plan` and the check that refuses runs that cannot fit
(ablate.cost.memory asks the registry, before any compute). Each registered class gives two static methods:

    state_elements(shapes: ParamShapes, world: int) -> int
        this rank's persistent state (fp32 elements): what its state dict holds, sharded as the parameters are
    transient_elements(shapes: ParamShapes, world: int) -> int
        the temporaries its step() needs beyond that state, at their largest (fp32 elements)

both from the model's parameter shapes as FSDP2 wraps them (shard_elements counts a rank's shards).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ParamShapes:
    """The model's parameter shapes as FSDP2 wraps them: the root's (embedding, final norm, an untied head), the
    largest block's (every block has the same unless MoE layers alternate with dense ones) and every block's. A
    block's 2-D and 3-D (experts') weights are its hidden matrices; everything else is a vector, or the root's."""

    root: list[tuple[int, ...]]
    block: list[tuple[int, ...]]
    all_blocks: list[tuple[int, ...]]


def shard_elements(shapes, world: int) -> int:
    """Elements of this rank's shards of `shapes`: FSDP2 splits dim 0 into `world` equal parts, padding the last."""
    return sum(-(-s[0] // world) * math.prod(s[1:]) for s in shapes)
