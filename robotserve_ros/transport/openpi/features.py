"""openpi observation dicts -> core Observations in the policy's input order, by a declared
key map (openpi key -> policy feature), and the server metadata that says what the policy
expects. An observation missing a mapped key or carrying one the map does not take is
refused naming the key."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...core.observation import BadObservation, Observation
from ..tensors import shown

STATE = "observation.state"
TASK = "task"  # the instruction, LeRobot's name for it
EXEC_KEY = "robotserve/exec"  # optional execution info from clients that send it
# openpi's conventions (its LIBERO/ALOHA examples): the main camera, then the wrist camera.
OPENPI_IMAGES = ("observation/image", "observation/wrist_image")


@dataclass(frozen=True)
class PolicyFeatures:
    """What the served policy takes: cameras (name, (h, w) or None for any), state size
    (None: any), chunk length and action size."""

    cameras: tuple
    state_dim: Optional[int]
    chunk_len: int
    action_dim: int

    @classmethod
    def of(cls, engine) -> "PolicyFeatures":
        keys = getattr(engine, "image_keys", None)
        if keys is not None:  # a LeRobot policy: its own feature names and image sizes (C, H, W)
            cams = tuple((k, tuple(s[1:])) for k, s in zip(keys, engine.image_shapes))
            return cls(cams, int(engine.state_dim), int(engine.chunk_len), int(engine.action_dim))
        spec = getattr(engine, "observation_spec", None)  # a stand-in engine takes what comes
        n = (spec.cameras or 0) if spec is not None else 0
        return cls(tuple((f"observation.images.camera{i}", None) for i in range(n)),
                   getattr(spec, "joints", None), int(getattr(engine, "chunk_size", 1)),
                   int(getattr(engine, "action_dim", 1)))


class KeyMap:
    """openpi key -> policy feature, checked against the policy when the endpoint starts."""

    def __init__(self, declared: dict, feats: PolicyFeatures) -> None:
        names = [c for c, _ in feats.cameras]
        if declared:
            kmap = dict(declared)
        else:
            kmap = {(OPENPI_IMAGES[i] if i < len(OPENPI_IMAGES) else f"observation/image_{i}"): n
                    for i, n in enumerate(names)}
            kmap.update({"observation/state": STATE, "prompt": TASK})
        wanted = set(names) | {STATE, TASK}
        for k, v in kmap.items():
            if v not in wanted:
                raise ValueError(f"key_map: {k!r} -> {v!r}, but the policy takes {sorted(wanted)}")
        targets = list(kmap.values())
        dup = {v for v in targets if targets.count(v) > 1}
        if dup:
            raise ValueError(f"key_map: {sorted(dup)} mapped from more than one openpi key")
        missing = [n for n in [*names, STATE] if n not in targets]
        if missing:
            raise ValueError(f"key_map: the policy's {missing} come from no openpi key")
        self.map, self.feats = kmap, feats
        by_feature = {v: k for k, v in kmap.items()}
        self.cameras = [(by_feature[n], hw) for n, hw in feats.cameras]
        self.state_key = by_feature[STATE]
        self.task_key = by_feature.get(TASK)

    def observation(self, raw: dict, stamp: float) -> Observation:
        """The observation in the policy's order; BadObservation naming the key otherwise."""
        extra = [k for k in raw if k not in self.map and k != EXEC_KEY]
        if extra:
            raise BadObservation(f"observation key {shown(str(extra[0]))} is not one this server takes "
                                 f"(key map: {', '.join(self.map)})")
        missing = [k for k in self.map if k not in raw and k != self.task_key]
        if missing:
            raise BadObservation(f"observation lacks {shown(missing[0])} (the policy's {self.map[missing[0]]})")
        q = raw[self.state_key]
        if isinstance(q, (list, tuple)):
            q = np.asarray(q) if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in q) else None
        if not isinstance(q, np.ndarray) or q.dtype.kind not in "iuf" or q.ndim != 1:
            raise BadObservation(f"{shown(self.state_key)} must be a 1-D numeric array")
        want = self.feats.state_dim
        if want is not None and q.shape[0] != want:
            raise BadObservation(f"{shown(self.state_key)} has {q.shape[0]} values, the policy takes {want}")
        q = q.astype(np.float32)
        if not np.all(np.isfinite(q)):
            raise BadObservation(f"{shown(self.state_key)} must be finite numbers")
        images = [camera_image(k, raw[k], hw) for k, hw in self.cameras]
        task = raw.get(self.task_key, "") if self.task_key else ""
        if not isinstance(task, str):
            raise BadObservation(f"{shown(self.task_key)} must be a string")
        return Observation(images=images, joints=q, instruction=task, stamp=stamp)

    def metadata(self) -> dict:
        """What the policy expects, for the first frame (openpi's server metadata)."""
        f = self.feats
        return {"images": {k: {"feature": self.map[k], "shape": [*hw, 3] if hw else None, "dtype": "uint8"}
                           for k, hw in self.cameras},
                "state": {"key": self.state_key, "dim": f.state_dim}, "prompt": self.task_key,
                "chunk_size": f.chunk_len, "action_dim": f.action_dim, "exec_key": EXEC_KEY}


def camera_image(key: str, img, hw: Optional[tuple]) -> np.ndarray:
    """An HxWx3 uint8 camera image (openpi clients send HWC; CHW is transposed), resized to
    the policy's size as LeRobot's and openpi's servers do (bilinear)."""
    if isinstance(img, np.ndarray) and img.ndim == 3 and img.shape[0] == 3 and img.shape[2] != 3:
        img = img.transpose(1, 2, 0)
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or 0 in img.shape:
        raise BadObservation(f"camera {shown(key)} must be an HxWx3 uint8 array, got "
                             f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}")
    if hw is not None and img.shape[:2] != tuple(hw):
        import cv2

        img = cv2.resize(np.ascontiguousarray(img), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(img)


EXEC_FIELDS = ("actions_left", "control_hz", "horizon", "reset", "rtc", "rtc_leftover")


def exec_info(raw, hz: float) -> tuple:
    """The optional `robotserve/exec` dict: (actions_left or None, control_hz, horizon or None,
    reset, rtc or None, rtc_leftover or None). rtc: this session's real-time chunking on or off
    (None: as the server's `rtc`); rtc_leftover: the client's own unexecuted actions [k,
    action_dim] (the core checks its shape). BadObservation names a wrong field."""
    if raw is None:
        return None, hz, None, False, None, None
    if not isinstance(raw, dict) or not set(raw) <= set(EXEC_FIELDS):
        raise BadObservation(f"{EXEC_KEY} must be a dict of {', '.join(EXEC_FIELDS)}")

    def count(name, lo):
        v = raw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo):
            raise BadObservation(f"{EXEC_KEY}.{name} must be an integer >= {lo}")
        return None if v is None else int(v)

    rate = raw.get("control_hz", hz)
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.number)) or not (0 < float(rate) <= 10000 and math.isfinite(rate)):
        raise BadObservation(f"{EXEC_KEY}.control_hz must be a number in (0, 10000]")
    reset, rtc = raw.get("reset", False), raw.get("rtc")
    if not isinstance(reset, bool):
        raise BadObservation(f"{EXEC_KEY}.reset must be true or false")
    if rtc is not None and not isinstance(rtc, bool):
        raise BadObservation(f"{EXEC_KEY}.rtc must be true or false")
    return count("actions_left", 0), float(rate), count("horizon", 1), reset, rtc, leftover_of(raw.get("rtc_leftover"))


def leftover_of(v) -> Optional[np.ndarray]:
    """rtc_leftover as a 2-D float32 array (rows: actions, next first); its width and values are the
    core's to check against the policy (RtcGuide.sent_problems)."""
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        try:
            v = np.asarray(v, np.float32)
        except (TypeError, ValueError):
            raise BadObservation(f"{EXEC_KEY}.rtc_leftover must be a 2-D array of numbers [actions, action_dim]") from None
    if not isinstance(v, np.ndarray) or v.dtype.kind not in "iuf" or v.ndim != 2:
        raise BadObservation(f"{EXEC_KEY}.rtc_leftover must be a 2-D array of numbers [actions, action_dim]")
    return v.astype(np.float32)
