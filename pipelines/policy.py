"""A small action-chunking policy: one tiny CNN per camera plus an MLP on the state, predicting ``k`` actions.

Observation windows (a training recipe's ``[cameras]`` / ``[state]``, e.g. Diffusion Policy's 2 steps) are
read whole: a camera window ``(B, T, C, H, W)`` enters its CNN as ``T * C`` stacked channels, a state window
``(B, T, D)`` is normalised per step and flattened to ``T * D``. Without a window a camera is ``(B, C, H, W)``.

It exists to exercise the input pipeline under a real optimiser step (forward, masked loss, backward,
DDP gradient averaging), not to be a good policy. Its input is the batch dict that
:class:`~lerobot_dali.iterator.DALILeRobotIterator` yields, as LeRobot policies take a ``DataLoader`` batch.

State and action are normalised inside the model with buffers (mean, std), so the statistics travel with
every checkpoint and every rank uses the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lerobot_dali.value_checks import check_int_fields

__all__ = ["ACTION_KEY", "STATE_KEY", "ChunkPolicy", "FeatureStats", "PolicyConfig", "masked_l1"]

#: The features the policy reads, by LeRobot's names (the training scripts' checks and messages name them too).
STATE_KEY = "observation.state"
ACTION_KEY = "action"


@dataclass(frozen=True, kw_only=True)
class FeatureStats:
    """Per-component mean and standard deviation of one vector feature (``observation.state``, ``action``)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.mean or len(self.mean) != len(self.std):
            raise ValueError(f"mean and std need the same non-zero length, got {len(self.mean)} and {len(self.std)}")
        if any(not s >= 0 for s in self.std):
            raise ValueError(f"std must be >= 0 (a NaN is not), got {self.std}")

    @classmethod
    def identity(cls, dim: int) -> FeatureStats:
        """Mean 0, std 1: no normalisation, for a feature the dataset has no statistics for."""
        return cls(mean=(0.0,) * dim, std=(1.0,) * dim)


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Shapes and widths of :class:`ChunkPolicy`. ``chunk`` is the number of actions predicted per sample.

    ``camera_steps``: frames per camera window, each camera then ``(B, camera_steps, C, H, W)``; ``None``
    means one frame with no window axis, ``(B, C, H, W)``. ``state_steps``: steps of the state window
    ``(B, state_steps, D)``, all of which the policy reads; ``None`` means ``(B, D)``, or the last step of
    a ``(B, T, D)`` window.
    """

    camera_keys: tuple[str, ...]
    state_key: str = STATE_KEY
    action_key: str = ACTION_KEY
    state_dim: int
    action_dim: int
    chunk: int
    camera_steps: int | None = None
    state_steps: int | None = None
    #: Colour channels per camera, in ``camera_keys`` order (1 for grey image cameras); None: 3 for each.
    camera_channels: tuple[int, ...] | None = None
    conv_width: int = 32
    camera_features: int = 64
    hidden: int = 256

    def __post_init__(self) -> None:
        windows = ("camera_steps", "state_steps")  # None: no window
        names = ("state_dim", "action_dim", "chunk", "conv_width", "camera_features", "hidden", *windows)
        check_int_fields(self, ((name, 1) for name in names), label="PolicyConfig.{}".format, optional=windows)
        object.__setattr__(self, "camera_keys", tuple(self.camera_keys))
        channels = (3,) * len(self.camera_keys) if self.camera_channels is None else tuple(self.camera_channels)
        if len(channels) != len(self.camera_keys) or not all(c in (1, 3) for c in channels):
            raise ValueError(
                f"PolicyConfig.camera_channels must hold 1 or 3 per camera ({len(self.camera_keys)}), got "
                f"{self.camera_channels!r}"
            )
        object.__setattr__(self, "camera_channels", channels)


class _CameraEncoder(nn.Module):
    """Three strided convolutions, then a 4x4 average grid: cheap, and keeps coarse positions."""

    def __init__(self, channels: int, width: int, features: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, width, kernel_size=5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(width, width, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((4, 4)),
            nn.Flatten(),
            nn.Linear(width * 16, features),
            nn.ReLU(),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


class _Normalizer(nn.Module):
    """``(x - mean) / std``; a zero std (a constant component) divides by 1 instead."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, stats: FeatureStats) -> None:
        super().__init__()
        std = torch.tensor(stats.std, dtype=torch.float32)
        self.register_buffer("mean", torch.tensor(stats.mean, dtype=torch.float32))
        self.register_buffer("std", torch.where(std > 0, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def masked_l1(prediction: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor | None) -> torch.Tensor:
    """Mean absolute error over the ``(B, k, D)`` chunk, ignoring steps past the episode end (``is_pad``).

    Padded steps repeat the last action (LeRobot's clamp), so learning them would teach the policy to stop
    at every episode end; they are excluded, as LeRobot's ACT does.
    """
    error = (prediction - target).abs().mean(dim=-1)
    if is_pad is None:
        return error.mean()
    valid = (~is_pad.bool()).to(error.dtype)
    return (error * valid).sum() / valid.sum().clamp(min=1.0)


class ChunkPolicy(nn.Module):
    """``batch -> loss`` in :meth:`forward` (what DDP wraps), ``batch -> actions`` in :meth:`predict`."""

    def __init__(self, config: PolicyConfig, *, state_stats: FeatureStats, action_stats: FeatureStats) -> None:
        super().__init__()
        if len(state_stats.mean) != config.state_dim or len(action_stats.mean) != config.action_dim:
            raise ValueError(
                f"stats have {len(state_stats.mean)} state and {len(action_stats.mean)} action components; "
                f"the config says {config.state_dim} and {config.action_dim}"
            )
        self.config = config
        self.state_norm = _Normalizer(state_stats)
        self.action_norm = _Normalizer(action_stats)
        steps = config.camera_steps or 1  # a window's frames stacked on channels
        self.cameras = nn.ModuleList(
            _CameraEncoder(channels * steps, config.conv_width, config.camera_features)
            for channels in config.camera_channels or ()
        )
        inputs = config.state_dim * (config.state_steps or 1) + config.camera_features * len(config.camera_keys)
        self.head = nn.Sequential(
            nn.Linear(inputs, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.chunk * config.action_dim),
        )

    def _state_features(self, state: torch.Tensor) -> torch.Tensor:
        steps = self.config.state_steps
        if steps is None:
            if state.ndim == 3:  # a state window the config does not ask for: condition on the current (last) step
                state = state[:, -1]
            return self.state_norm(state.float())
        if state.ndim != 3 or state.shape[1] != steps:
            raise ValueError(
                f"{self.config.state_key!r} has shape {tuple(state.shape)}; expected (B, {steps}, "
                f"{self.config.state_dim}), a window of state_steps={steps} steps"
            )
        return self.state_norm(state.float()).flatten(1)

    def _camera_input(self, key: str, images: torch.Tensor) -> torch.Tensor:
        steps = self.config.camera_steps
        if steps is None:
            if images.ndim != 4:
                raise ValueError(
                    f"camera {key!r} has shape {tuple(images.shape)}; this policy was built for one frame "
                    "(B, C, H, W): give the camera no delta_timestamps window or set PolicyConfig.camera_steps"
                )
            return images.float()
        if images.ndim != 5 or images.shape[1] != steps:
            raise ValueError(
                f"camera {key!r} has shape {tuple(images.shape)}; expected a window (B, {steps}, C, H, W) "
                f"of camera_steps={steps} frames"
            )
        return images.float().flatten(1, 2)  # (B, T*C, H, W): frames stacked on channels, oldest first

    def _normalized_prediction(self, batch: Mapping[str, Any]) -> torch.Tensor:
        parts = [self._state_features(batch[self.config.state_key])]
        for key, encoder in zip(self.config.camera_keys, self.cameras, strict=True):
            parts.append(encoder(self._camera_input(key, batch[key])))
        out = self.head(torch.cat(parts, dim=-1))
        return out.view(-1, self.config.chunk, self.config.action_dim)

    def forward(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The training loss: masked L1 between predicted and true (normalised) action chunks."""
        key = self.config.action_key
        target = batch[key]
        if target.ndim != 3 or target.shape[1] != self.config.chunk:
            raise ValueError(
                f"{key!r} has shape {tuple(target.shape)}; expected (B, {self.config.chunk}, {self.config.action_dim}) "
                f"from an action window of {self.config.chunk} steps"
            )
        prediction = self._normalized_prediction(batch)
        return masked_l1(prediction, self.action_norm(target.float()), batch.get(f"{key}_is_pad"))
