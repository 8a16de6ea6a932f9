"""Compressed camera frames (JPEG / PNG) on the live path and on the gRPC link (issue 26 item 3).

A 224x224 rgb8 frame is 150 KB raw; as JPEG q90 it is a few KB. Robots (robot_client's
`image_transport`) and the edge's remote tiers (RemoteEngine's `image_transport`) encode;
the inference server and the GPU server decode here, at request conversion, so a frame the
policy cannot take is refused before it is queued.

Decoding is bounded: the frame's header (read by Pillow, which parses it without decoding
the pixels) must name a JPEG or PNG of the policy's width x height (or, for a policy of any
size, no more pixels than the server's max_bytes allows) before OpenCV decodes it, so a
small file that claims a huge image (a decompression bomb) costs nothing. Refusals are
BadObservation / PayloadTooLarge, counted by the server under those codes like any other
malformed observation.
"""
from __future__ import annotations

import io
from typing import Optional

import numpy as np

from ..core.observation import BadObservation, ObservationSpec, PayloadTooLarge

# What a robot may send: raw sensor_msgs/Image, or a CompressedImage of one of these.
TRANSPORTS = ("raw", "jpeg", "png")
# Pillow's name of the format -> ours; Pillow mode -> (ROS encoding, OpenCV decode flag name).
_FORMATS = {"JPEG": "jpeg", "PNG": "png"}
_MODES = {"RGB": ("rgb8", "IMREAD_COLOR_RGB"), "L": ("mono8", "IMREAD_GRAYSCALE")}
_CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1}


def quality_range(transport: str) -> tuple[int, int]:
    """image_quality's range: JPEG quality, or PNG's compression level."""
    return (0, 9) if transport == "png" else (1, 100)


def _cv2():
    import cv2  # the package's image library (requirements: opencv-python-headless)

    return cv2


def encode_frame(img: np.ndarray, encoding: str = "rgb8", transport: str = "jpeg", quality: int = 90) -> tuple[str, bytes]:
    """An HxWxC uint8 frame -> (CompressedImage.format, bytes). `quality`: JPEG quality 1..100,
    or the PNG compression level 0..9 for png. The format string follows ROS image_transport's
    compressed plugin ("rgb8; jpeg compressed bgr8"), so rqt and bag tools read it."""
    cv2 = _cv2()
    if transport not in ("jpeg", "png"):
        raise ValueError(f"image transport {transport!r} does not compress; one of jpeg, png")
    if encoding not in _CHANNELS:
        raise ValueError(f"encoding {encoding!r} cannot be compressed; one of {', '.join(_CHANNELS)}")
    img = np.asarray(img, dtype=np.uint8)
    if encoding == "rgb8":  # OpenCV encodes BGR: the file then shows true colours anywhere
        img = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    if transport == "jpeg":
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    else:
        ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, int(quality)])
    if not ok:
        raise ValueError(f"OpenCV could not encode a {img.shape} {encoding} frame as {transport}")
    stored = "mono8" if encoding == "mono8" else "bgr8"
    return f"{encoding}; {transport} compressed {stored}", buf.tobytes()


def compressible(img: np.ndarray) -> bool:
    """An array camera JPEG/PNG can carry exactly as to shape and type: HxWx1 or HxWx3 uint8."""
    return img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] in (1, 3)


def compress_image_msg(out, im, transport: str, quality: int) -> None:
    """Fill CompressedImage `out` from sensor_msgs/Image `im` (rgb8, bgr8 or mono8)."""
    ch = _CHANNELS.get(im.encoding)
    if ch is None:
        raise ValueError(f"camera encoding {im.encoding!r} cannot be compressed; one of {', '.join(_CHANNELS)}")
    img = np.frombuffer(bytes(im.data), np.uint8).reshape(im.height, im.step // ch, ch)[:, :im.width]
    if im.encoding == "bgr8":  # sent as what it shows: rgb colours in a standard file
        img, enc = img[..., ::-1], "rgb8"
    else:
        enc = im.encoding
    out.header = im.header
    out.format, data = encode_frame(img, enc, transport, quality)
    out.data = data


def frame_kind(fmt: str) -> Optional[str]:
    """'jpeg' / 'png' from a CompressedImage.format ("jpeg", "png", "rgb8; jpeg compressed bgr8")."""
    f = fmt.lower()
    return "jpeg" if "jpeg" in f or "jpg" in f else "png" if "png" in f else None


class DecodeBudget:
    """Bytes the frames of a request (or of a whole call) may decode to, together: each frame
    claims its size from its header before a pixel is decoded, and the one that would pass
    the budget is refused undecoded. Per-frame limits alone let many small files of zeros
    claim the most each (docs/security.md)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit, self.name, self.used = int(limit), name, 0

    def take(self, what: str, n: int) -> None:
        if self.used + n > self.limit:
            raise PayloadTooLarge(f"{what}: decodes to {n} bytes, past the {self.limit} bytes its {self.name} may "
                                  f"decode to ({self.used} taken already; not decoded)")
        self.used += n


def _header(what: str, fmt: str, data: bytes, spec: ObservationSpec) -> tuple:
    """A frame's header checked against `spec`: (kind, w, h, encoding, flag, decoded bytes)."""
    kind = frame_kind(fmt)
    if kind is None:
        raise BadObservation(f"{what}: format {fmt[:40]!r} is not jpeg or png")
    from PIL import Image as PILImage

    try:  # Pillow reads the header only (lazy): the size a file claims, before any decoding
        with PILImage.open(io.BytesIO(data), formats=list(_FORMATS)) as head:
            found, (w, h), mode = _FORMATS[head.format], head.size, head.mode
    except PILImage.DecompressionBombError:  # Pillow's own guard: far past any policy's size
        raise PayloadTooLarge(f"{what}: claims over {2 * PILImage.MAX_IMAGE_PIXELS} pixels (not decoded)") from None
    except Exception:  # not an image, a truncated or unreadable header
        raise BadObservation(f"{what}: {len(data)} bytes that are not a readable {kind} file") from None
    if found != kind:
        raise BadObservation(f"{what}: format says {kind} but the data is {found}")
    if mode not in _MODES:
        raise BadObservation(f"{what}: {kind} of mode {mode}; rgb or 8-bit grey are accepted")
    encoding, flag = _MODES[mode]
    if encoding not in spec.encodings:
        raise BadObservation(f"{what}: decodes to {encoding}; the policy takes one of {', '.join(spec.encodings)}")
    if spec.width is not None and w != spec.width or spec.height is not None and h != spec.height:
        raise BadObservation(f"{what}: {w}x{h} but the policy takes {spec.width}x{spec.height} (not decoded)")
    if w < 1 or h < 1:
        raise BadObservation(f"{what}: empty ({w}x{h})")
    raw = w * h * _CHANNELS[encoding]
    if raw > spec.max_bytes:
        raise PayloadTooLarge(f"{what}: claims {w}x{h} ({raw} bytes decoded), the server accepts at "
                              f"most {spec.max_bytes} (not decoded)")
    if kind == "jpeg" and not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        # libjpeg fills a truncated scan with grey and only warns: the policy must not see that
        raise BadObservation(f"{what}: truncated jpeg (no end-of-image marker)")
    return kind, w, h, encoding, flag, raw


def _decode(what: str, data: bytes, kind: str, w: int, h: int, flag: str) -> np.ndarray:
    cv2 = _cv2()
    img = cv2.imdecode(np.frombuffer(data, np.uint8), getattr(cv2, flag))
    if img is None or img.shape[:2] != (h, w):
        raise BadObservation(f"{what}: corrupt {kind} data")
    return img.reshape(h, w, -1)


def decode_frame(what: str, fmt: str, data, spec: ObservationSpec) -> np.ndarray:
    """One compressed frame -> HxWxC uint8 (rgb8 or mono8), or BadObservation / PayloadTooLarge
    naming `what` (the field). The header is checked against `spec` before a pixel is decoded."""
    data = bytes(data)
    kind, w, h, _, flag, _ = _header(what, fmt, data, spec)
    return _decode(what, data, kind, w, h, flag)


def decode_frames(prefix: str, frames, spec: ObservationSpec, call: Optional[DecodeBudget] = None) -> list:
    """A request's compressed frames (objects with .format and .data), named `prefix[i]`: every
    header checked first, their decoded sizes together within spec.max_bytes (the request's
    budget) and `call`'s (a call's, shared by its requests), then decoded."""
    budget = DecodeBudget(spec.max_bytes, "request")
    heads = []
    for i, f in enumerate(frames):
        what, data = f"{prefix}[{i}]", bytes(f.data)
        head = _header(what, f.format, data, spec)
        budget.take(what, head[5])
        if call is not None:
            call.take(what, head[5])
        heads.append((what, data, head))
    return [_decode(what, data, kind, w, h, flag) for what, data, (kind, w, h, _, flag, _) in heads]


class FrameEncoder:
    """A robot's cameras -> sensor_msgs/CompressedImage, each camera's latest frame encoded
    once however many rounds (and re-sends) carry it."""

    def __init__(self, transport: str = "jpeg", quality: int = 90) -> None:
        from sensor_msgs.msg import CompressedImage

        if transport not in TRANSPORTS[1:]:
            raise ValueError(f"image transport {transport!r} does not compress; one of {', '.join(TRANSPORTS[1:])}")
        self.transport, self.quality, self._make = transport, int(quality), CompressedImage
        self._last: dict = {}  # camera index -> (the Image it came from, its CompressedImage)

    def encode(self, images) -> list:
        out = []
        for i, im in enumerate(images):
            last = self._last.get(i)
            if last is None or last[0] is not im:
                c = self._make()
                compress_image_msg(c, im, self.transport, self.quality)
                last = self._last[i] = (im, c)
            out.append(last[1])
        return out
