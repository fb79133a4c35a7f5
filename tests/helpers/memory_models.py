"""Models for ``drivetrain estimate-memory`` tests: parameter counts that are easy to add up by hand."""

import torch
from torch import nn


class Tiny(nn.Module):
    """220 trainable parameters (Linear 10->20), 105 frozen ones (Linear 20->5), and a buffer of 7."""

    def __init__(self, width: int = 20) -> None:
        super().__init__()
        self.body = nn.Linear(10, width)
        self.head = nn.Linear(width, 5).requires_grad_(False)
        self.register_buffer("counts", torch.zeros(7))


def not_a_module() -> int:
    return 3
