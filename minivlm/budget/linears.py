"""One nn.Linear's shape on one of tp GPUs (the weight matrix out x in and its bias), as tensor_parallel.py splits
it: column-parallel splits the outputs, row-parallel the inputs."""
from dataclasses import dataclass

from minivlm.budget.tensor_parallel import split


@dataclass(frozen=True)
class LinearShape:
    """The shape of one nn.Linear (or the matrix of a conv / embedding): weight out x in, optional bias of size out."""
    name: str
    out_features: int
    in_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.out_features * self.in_features + (self.out_features if self.bias else 0)


def column(name: str, out_features: int, in_features: int, bias: bool, tp: int) -> LinearShape:
    """A column-parallel linear on one GPU: the outputs (and their biases) split."""
    return LinearShape(name, split(out_features, tp), in_features, bias)


def row(name: str, out_features: int, in_features: int, bias: bool, tp: int) -> LinearShape:
    """A row-parallel linear on one GPU: the inputs split, the bias whole."""
    return LinearShape(name, out_features, split(in_features, tp), bias)
