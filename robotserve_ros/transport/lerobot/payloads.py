"""LeRobot's payloads in and out: chunked transfers, allow-listed pickles, its raw
observation dict mapped to a core Observation, and chunks timed as LeRobot's server times them."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import grpc
import numpy as np

from ...core.observation import BadObservation, Observation, PayloadTooLarge
from .. import safe_pickle
from ..tensors import shown

STATE_KEY = "observation.state"
IMAGE_PREFIX = "observation.images."


class Refused(Exception):
    """A call refused: answered with `code` and `message`, counted under `key` unless the
    core has counted it already (`counted`: a request the core itself refused)."""

    def __init__(self, key: str, code: grpc.StatusCode, message: str, counted: bool = False) -> None:
        super().__init__(message)
        self.key, self.code, self.message, self.counted = key, code, message, counted


@dataclass
class Layout:
    """Where the policy's inputs sit in one client's raw observation dict."""

    state_names: list  # joint keys, in the policy's state order
    cameras: list  # (raw camera key, (h, w) the policy takes or None to pass as is)


def lerobot_modules():
    """LeRobot's helpers (TimedAction & co.), constants and stubs, imported behind the torchvision shim."""
    from ...engines.torch_env import import_lerobot_policies

    import_lerobot_policies()
    from lerobot.async_inference import constants, helpers
    from lerobot.transport import services_pb2, services_pb2_grpc

    return helpers, constants, services_pb2, services_pb2_grpc


class Payloads:
    """Decoding and encoding for one endpoint (its caps, its clock, its action rate)."""

    def __init__(self, pb, helpers, cfg, clock) -> None:
        self.pb, self.helpers, self.fps, self.clock = pb, helpers, cfg.fps, clock
        self.max_bytes, self.limits = cfg.max_payload_bytes, cfg.pickle_limits()
        self.max_pieces, self.timeout_s = cfg.max_upload_pieces, cfg.upload_timeout_s
        import torch

        self.torch = torch

    def join(self, pieces) -> bytes:
        """LeRobot's chunked transfer (transport.utils.receive_bytes_in_chunks), capped in
        bytes, pieces and time (a stream stalled between pieces is cancelled by the servicer)."""
        pb, cap = self.pb, self.max_bytes
        buf, n = [], 0
        end = time.monotonic() + self.timeout_s
        for count, item in enumerate(pieces, 1):
            if count > self.max_pieces:
                raise Refused("upload_limit", grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"observation stream of more than max_upload_pieces ({self.max_pieces}) pieces")
            if time.monotonic() > end:
                raise Refused("upload_limit", grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"observation stream open longer than upload_timeout_s ({self.timeout_s} s)")
            st = item.transfer_state
            if st == pb.TRANSFER_BEGIN:
                buf, n = [], 0
            elif st not in (pb.TRANSFER_MIDDLE, pb.TRANSFER_END):
                raise Refused("bad_transfer", grpc.StatusCode.INVALID_ARGUMENT, f"unknown transfer state {st}")
            n += len(item.data)
            if n > cap:
                raise Refused(PayloadTooLarge.code, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"observation larger than max_payload_bytes ({cap}) this server accepts")
            buf.append(item.data)
            if st == pb.TRANSFER_END:
                return b"".join(buf)
        raise Refused("bad_transfer", grpc.StatusCode.INVALID_ARGUMENT, "observation stream ended before TRANSFER_END")

    def loads(self, data: bytes, kind: type, what: str):
        try:
            obj = safe_pickle.loads(data, limits=self.limits)
        except PayloadTooLarge as e:
            raise Refused(e.code, grpc.StatusCode.RESOURCE_EXHAUSTED, f"{what}: {e.message}") from None
        except safe_pickle.UnsafePickle as e:
            raise Refused(e.code, grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {e.message}") from None
        if not isinstance(obj, kind):
            raise Refused("bad_payload", grpc.StatusCode.INVALID_ARGUMENT,
                          f"{what}: expected a pickled {kind.__name__}, got {type(obj).__name__}")
        return obj

    def observation(self, tobs, layout: Layout) -> Observation:
        """LeRobot's raw observation dict -> core Observation in the policy's input order
        (BadObservation, a request error of the client's task, if it does not fit)."""
        raw, step, stamp = tobs.observation, tobs.timestep, tobs.timestamp
        if not isinstance(raw, dict):
            raise BadObservation(f"observation must be a dict, got {type(raw).__name__}")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise BadObservation(f"timestep must be an integer >= 0, got {shown(str(step))}")
        if not isinstance(stamp, (float, int, np.floating)) or not math.isfinite(stamp):
            raise BadObservation(f"timestamp must be a finite number, got {shown(str(stamp))}")
        try:
            q = np.array([raw[n] for n in layout.state_names], dtype=np.float32)
        except KeyError as e:
            raise BadObservation(f"joint {shown(e.args[0])} missing from the observation") from None
        except (TypeError, ValueError):
            raise BadObservation("joint values must be numbers") from None
        if q.ndim != 1 or not np.all(np.isfinite(q)):
            raise BadObservation("joint values must be finite numbers")
        images = []
        for cam, hw in layout.cameras:
            img = raw.get(cam)
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or 0 in img.shape:
                raise BadObservation(f"camera {shown(cam)} must be an HxWx3 uint8 array, got "
                                      f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}")
            if hw is not None and img.shape[:2] != hw:
                import cv2  # LeRobot's server resizes to the policy's image size too (bilinear)

                img = cv2.resize(img, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
            images.append(np.ascontiguousarray(img))
        task = raw.get("task", "")
        if not isinstance(task, str):
            raise BadObservation("'task' must be a string")
        # The capture time on the server's clock: client wall time, assumed synced (LeRobot does too).
        age = min(max(time.time() - float(stamp), 0.0), 5.0)
        return Observation(images=images, joints=q, instruction=task, timestep=int(step), stamp=self.clock.now() - age)

    def timed_actions(self, actions: np.ndarray, t0: int, stamp: float) -> list:
        """LeRobot's PolicyServer._time_action_chunk: action i at timestep t0 + i, stamp + i/fps."""
        dt, torch, TA = 1.0 / self.fps, self.torch, self.helpers.TimedAction
        rows = np.asarray(actions, np.float32)
        return [TA(timestamp=stamp + i * dt, timestep=t0 + i, action=torch.from_numpy(rows[i].copy()))
                for i in range(len(rows))]
