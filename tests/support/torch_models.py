"""Small PyTorch models built at test time with fixed seeds (no binaries in the repository).

Every builder returns an ``nn.Module`` in eval mode; ``save_torchscript`` / ``save_exported`` write
the two file formats the pytorch backend serves. Import only where torch is installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

# torch.jit.script is deprecated in favour of torch.export, but TorchScript is what Triton serves
warnings.filterwarnings("ignore", message=r".*torch\.jit\.(script|trace|save|load).*deprecated", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit.*")


class ConvClassifier(nn.Module):
    """A few conv layers and a linear head: [3, 16, 16] → 10 logits."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def classifier(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ConvClassifier().eval()


class Named(nn.Module):
    """forward(image, scale): names bind by argument name. image [4], scale [1] → scaled [4], total [1]."""

    def forward(self, image: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = image * scale
        return scaled, scaled.sum(dim=1, keepdim=True)


class Pair(nn.Module):
    """A tuple of results: (a + b, a - b, a * b)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return a + b, a - b, a * b


class ListResult(nn.Module):
    """A list of results (List[Tensor]): [x + 1, x * 2]."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x + 1, x * 2]


class DictInput(nn.Module):
    """A single Dict[str, Tensor] argument: inputs arrive under their config names."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["left"] * 10 + inputs["right"]


class AllTypes(nn.Module):
    """One argument per data type; each result keeps its argument's dtype."""

    def forward(
        self,
        f16: torch.Tensor,
        bf16: torch.Tensor,
        i8: torch.Tensor,
        i16: torch.Tensor,
        i32: torch.Tensor,
        i64: torch.Tensor,
        flag: torch.Tensor,
        u8: torch.Tensor,
        f64: torch.Tensor,
    ) -> tuple[
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
    ]:
        return (
            f16 * 2,
            bf16 * 2,
            i8 - 1,
            i16 * 3,
            i32 + 7,
            i64 * 1000000000,
            torch.logical_not(flag),
            u8 + 1,
            f64 / 3,
        )


class Spin(nn.Module):
    """Runs ``rounds`` small matrix products: a forward whose length the request chooses."""

    def forward(self, x: torch.Tensor, rounds: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(int(rounds.sum().item())):
            y = torch.tanh(y @ y.transpose(0, 1)[: y.shape[1], : y.shape[1]] * 0.01 + y)
        return y


class Words(nn.Module):
    """List[str] in, List[str] out (Triton's TYPE_STRING)."""

    def forward(self, words: list[str]) -> list[str]:
        return [w.upper() + "!" for w in words]


class WrongDtype(nn.Module):
    """Returns FP32 whatever its config says."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * 2


def save_torchscript(module: nn.Module, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(path))
    return path


def save_exported(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, max_batch: int = 16) -> Path:
    """A torch.export program with a dynamic batch dimension on every argument."""
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    program = torch.export.export(module, example, dynamic_shapes=tuple({0: batch} for _ in example))
    torch.export.save(program, str(path))
    return path


def run(module: nn.Module, *arrays: np.ndarray) -> list[np.ndarray]:
    """The module's own outputs for numpy inputs (the reference the served outputs must equal)."""
    with torch.inference_mode():
        out = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in outs]


# ---- ResNet-18 CIFAR with the ONNX example's weights ------------------------------------------------


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1, stride, 0) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(h + self.skip(x))


class ResNet18Cifar(nn.Module):
    """The architecture of ``kubeinfer.server.examples.models.resnet18_cifar`` (BN folded into convs)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, 1, 1)
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.stem(x)))
        return self.fc(x.mean(dim=(2, 3)))


def resnet18_cifar(seed: int = 0) -> nn.Module:
    """ResNet-18 CIFAR carrying exactly the weights of the ONNX example model built with ``seed``."""
    from kubeinfer.server.examples import models
    from onnx import numpy_helper

    onnx_model = models.resnet18_cifar(seed=seed)
    weights = [numpy_helper.to_array(t) for t in onnx_model.graph.initializer]
    net = ResNet18Cifar()
    convs: list[nn.Conv2d] = [net.stem]
    for block in net.blocks:
        convs += [block.conv1, block.conv2]
        if isinstance(block.skip, nn.Conv2d):
            convs.append(block.skip)
    with torch.no_grad():
        it = iter(weights)
        for conv in convs:
            conv.weight.copy_(torch.from_numpy(np.array(next(it))))
            conv.bias.copy_(torch.from_numpy(np.array(next(it))))
        net.fc.weight.copy_(torch.from_numpy(np.array(next(it))).T)
        net.fc.bias.copy_(torch.from_numpy(np.array(next(it))))
        if next(it, None) is not None:
            raise AssertionError("the ONNX example has more weights than ResNet18Cifar")
    return net.eval()
