"""onnx's backend interface over polyc, so that onnx's own backend tests run on it.

import polyc.onnx.backend as backend        # or polyc.frontends.onnx.backend
outputs = backend.run_model(model, [x])     # prepare(model).run([x])
"""

from __future__ import annotations

import numpy as np
from onnx.backend.base import Backend, BackendRep

from polyc.frontends.onnx.session import InferenceSession


class PolycRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes the inputs in graph order (or a dict by name)."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            inputs = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class PolycBackend(Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> PolycRep:
        super().prepare(model, device, **kwargs)
        return PolycRep(InferenceSession(model, **kwargs))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = PolycBackend.prepare
run_model = PolycBackend.run_model
supports_device = PolycBackend.supports_device
