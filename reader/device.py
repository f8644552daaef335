"""The GPU path's options, where the README teaches them: ``reader.device.DeviceOptions``
(they live in :mod:`reader.runtime.device`; the sink that copies slots to the GPU is
:mod:`reader.runtime.sinks`)."""

from .runtime.device import DeviceOptions

__all__ = ["DeviceOptions"]
