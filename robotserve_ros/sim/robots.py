"""Kinematic robots for the simulated fleet, and a synthetic camera that sees them.

Pure Python + numpy (no rclpy): the ROS node in `robotserve_ros.nodes.sim_robot` wraps
these, and tests can drive them directly.

Both robots share one small interface:

    robot.names            joint (or axis) names, in the order of every array below
    robot.positions()      current positions (copy)
    robot.velocities()     velocities over the last step (copy)
    robot.targets()        commanded positions (copy)
    robot.command(t)       new setpoint: a sequence in `names` order, or {name: value}
    robot.step(dt)         advance the kinematics by dt seconds (dt >= 0)

Motion is rate-limited, not dynamic: every axis moves straight toward its setpoint at its
maximum speed and stops there. Because of that, one step of dt is exactly the same as many
steps that add up to dt (for a fixed setpoint), so a caller may step lazily: only when it
needs the state, or just before a new command arrives.

`render(robot, width, height)` rasterizes a camera image (HxWx3 uint8) of the robot's state
with plain numpy: a side view of the arm (links, gripper and the target cube) or a top-down
view of the drone.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Sequence, Tuple, Union

import numpy as np

Targets = Union[Sequence[float], np.ndarray, Mapping[str, float]]

__all__ = ["SimRobot", "SimArm", "SimDrone", "make_robot", "render", "ROBOT_TYPES"]


class SimRobot:
    """Common state and command handling for rate-limited kinematic robots."""

    names: Tuple[str, ...] = ()

    def __init__(self, lower: Sequence[float], upper: Sequence[float], max_speed: Sequence[float],
                 initial: Sequence[float] | None = None) -> None:
        n = len(self.names)
        self.lower = np.asarray(lower, dtype=np.float64).reshape(n)
        self.upper = np.asarray(upper, dtype=np.float64).reshape(n)
        self.max_speed = np.asarray(max_speed, dtype=np.float64).reshape(n)
        if np.any(self.max_speed <= 0) or not np.all(np.isfinite(self.max_speed)):
            raise ValueError(f"max speeds must be finite and > 0, got {self.max_speed.tolist()}")
        init = np.zeros(n) if initial is None else np.asarray(initial, dtype=np.float64).reshape(n)
        self._pos = self._limit(init)
        self._target = self._pos.copy()
        self._vel = np.zeros(n)
        self.time = 0.0  # seconds of simulated motion so far (sum of dt)

    # -- interface -----------------------------------------------------------------------
    def positions(self) -> np.ndarray:
        return self._pos.copy()

    def velocities(self) -> np.ndarray:
        return self._vel.copy()

    def targets(self) -> np.ndarray:
        return self._target.copy()

    def at_target(self, tol: float = 1e-9) -> bool:
        return bool(np.all(np.abs(self._target - self._pos) <= tol))

    def command(self, targets: Targets, *, ignore_unknown: bool = False) -> None:
        """Set a new setpoint. A mapping sets only the axes it names (others keep theirs).

        Raises ValueError on a wrong length, an unknown name (unless ignore_unknown) or a
        non-finite value; the previous setpoint is then kept unchanged.
        """
        new = self._target.copy()
        if isinstance(targets, Mapping):
            for name, value in targets.items():
                try:
                    i = self.names.index(name)
                except ValueError:
                    if ignore_unknown:
                        continue
                    raise ValueError(f"unknown joint {name!r}; known: {list(self.names)}") from None
                new[i] = float(value)
        else:
            arr = np.asarray(targets, dtype=np.float64).ravel()
            if arr.shape[0] != len(self.names):
                raise ValueError(f"expected {len(self.names)} positions {list(self.names)}, got {arr.shape[0]}")
            new = arr.copy()
        if not np.all(np.isfinite(new)):
            raise ValueError(f"non-finite target {new.tolist()}")
        self._target = self._limit(new)

    def step(self, dt: float) -> None:
        dt = float(dt)
        if not dt >= 0.0:  # also catches NaN
            raise ValueError(f"dt must be >= 0, got {dt}")
        if dt == 0.0:
            self._vel[:] = 0.0
            return
        delta = self._delta(dt)
        self._pos = self._wrap(self._pos + delta)
        self._vel = delta / dt
        self.time += dt

    # -- per-robot hooks ------------------------------------------------------------------
    def _delta(self, dt: float) -> np.ndarray:
        lim = self.max_speed * dt
        return np.clip(self._target - self._pos, -lim, lim)

    def _limit(self, q: np.ndarray) -> np.ndarray:
        return np.clip(q, self.lower, self.upper)

    def _wrap(self, q: np.ndarray) -> np.ndarray:
        return q


class SimArm(SimRobot):
    """A kinematic SO-101-like arm: 5 revolute joints and a gripper (0 closed .. 1 open).

    Angle conventions of the planar chain (shoulder_lift, elbow_flex, wrist_flex), all in rad:
    0 points the upper arm straight up and keeps each next link in line with the previous
    one; positive angles tip the chain forward (toward +x, where the cube lies). The chain's
    plane is turned about the vertical by shoulder_pan. wrist_roll turns the gripper about
    its own axis (it shows as the apparent jaw spread in the side view).
    """

    names = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
    # Limits of the SO-101 URDF (rad), gripper normalised to 0..1.
    LOWER = (-1.91986, -1.74533, -1.69000, -1.65806, -2.74385, 0.0)
    UPPER = (1.91986, 1.74533, 1.69000, 1.65806, 2.84121, 1.0)
    BASE_HEIGHT = 0.06  # m, table to shoulder axis
    CUBE_SIZE = 0.03  # m

    def __init__(self, max_joint_speed: float = 2.0, seed: int = 0,
                 link_lengths: Sequence[float] = (0.11, 0.13, 0.10),
                 initial: Sequence[float] | None = None) -> None:
        if not (math.isfinite(max_joint_speed) and max_joint_speed > 0):
            raise ValueError(f"max_joint_speed must be finite and > 0, got {max_joint_speed}")
        super().__init__(self.LOWER, self.UPPER, [max_joint_speed] * 6, initial)
        self.link_lengths = tuple(float(v) for v in link_lengths)
        if len(self.link_lengths) != 3 or min(self.link_lengths) <= 0:
            raise ValueError(f"link_lengths must be 3 positive lengths, got {link_lengths}")
        rng = np.random.default_rng(seed)
        self.cube_position = np.array([rng.uniform(0.14, 0.28), rng.uniform(-0.10, 0.10), self.CUBE_SIZE / 2])

    def forward_kinematics(self) -> np.ndarray:
        """(4, 3) points x, y, z in m: shoulder, elbow, wrist, tool (gripper base)."""
        pan, a1, q2, q3 = self._pos[0], self._pos[1], self._pos[2], self._pos[3]
        a2, a3 = a1 + q2, a1 + q2 + q3
        l1, l2, l3 = self.link_lengths
        r = np.cumsum([0.0, l1 * math.sin(a1), l2 * math.sin(a2), l3 * math.sin(a3)])
        z = self.BASE_HEIGHT + np.cumsum([0.0, l1 * math.cos(a1), l2 * math.cos(a2), l3 * math.cos(a3)])
        return np.stack([r * math.cos(pan), r * math.sin(pan), z], axis=1)

    def tool_position(self) -> np.ndarray:
        return self.forward_kinematics()[3]


class SimDrone(SimRobot):
    """A kinematic drone: x, y, z (m, z >= 0) and yaw (rad) toward a position/yaw setpoint.

    The position moves in a straight line at up to max_speed (m/s, the norm of the xyz
    velocity); yaw turns the short way round at up to max_yaw_rate (rad/s), wrapped to
    [-pi, pi).
    """

    names = ("x", "y", "z", "yaw")

    def __init__(self, max_speed: float = 2.0, max_yaw_rate: float = 1.5, arena: float = 5.0,
                 max_altitude: float = 30.0, initial: Sequence[float] | None = None, seed: int = 0) -> None:
        for label, v in (("max_speed", max_speed), ("max_yaw_rate", max_yaw_rate), ("arena", arena),
                         ("max_altitude", max_altitude)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{label} must be finite and > 0, got {v}")
        big = 1e6
        super().__init__((-big, -big, 0.0, -math.pi), (big, big, max_altitude, math.pi),
                         (max_speed, max_speed, max_speed, max_yaw_rate), initial)
        self.arena = float(arena)  # half-width in m of the ground area the camera sees
        self.seed = seed

    def _limit(self, q: np.ndarray) -> np.ndarray:
        q = q.copy()
        q[:3] = np.clip(q[:3], self.lower[:3], self.upper[:3])
        q[3] = _wrap_angle(q[3])
        return q

    def _wrap(self, q: np.ndarray) -> np.ndarray:
        q[3] = _wrap_angle(q[3])
        return q

    def _delta(self, dt: float) -> np.ndarray:
        d = np.empty(4)
        lin = self._target[:3] - self._pos[:3]
        dist = float(np.sqrt(lin @ lin))
        reach = self.max_speed[0] * dt
        d[:3] = lin if dist <= reach else lin * (reach / dist)
        dyaw = _wrap_angle(self._target[3] - self._pos[3])
        turn = self.max_speed[3] * dt
        d[3] = min(max(dyaw, -turn), turn)
        return d

    def at_target(self, tol: float = 1e-9) -> bool:
        e = self._target - self._pos
        e[3] = _wrap_angle(e[3])
        return bool(np.all(np.abs(e) <= tol))


def _wrap_angle(a: float) -> float:
    return (float(a) + math.pi) % (2 * math.pi) - math.pi


ROBOT_TYPES = ("so101", "drone")


def make_robot(robot_type: str, *, max_speed: float = 2.0, seed: int = 0) -> SimRobot:
    """The robot for a `robot_type` parameter value ("so101" or "drone")."""
    if robot_type == "so101":
        return SimArm(max_joint_speed=max_speed, seed=seed)
    if robot_type == "drone":
        return SimDrone(max_speed=max_speed, seed=seed)
    raise ValueError(f"unknown robot type {robot_type!r}; expected one of {list(ROBOT_TYPES)}")


# ======================================================================================
# Synthetic camera
# ======================================================================================
_BACKGROUNDS: Dict[Tuple[str, int, int], np.ndarray] = {}

# Arm side view: camera on the -y side looking at +y, weak perspective about its axis.
_ARM_VIEW_X = (-0.16, 0.40)  # m, visible x range at the reference depth
_ARM_VIEW_Z = (-0.04, 0.44)
_ARM_CAM_DIST = 0.8  # m from the camera to the plane y = 0
_LINK_COLORS = ((240, 160, 40), (230, 200, 50), (90, 170, 240))
_JOINT_COLOR = (40, 40, 48)
_JAW_COLOR = (200, 200, 210)
_CUBE_COLOR = (220, 40, 40)
_BASE_COLOR = (60, 60, 70)


def render(robot: SimRobot, width: int = 96, height: int = 96) -> np.ndarray:
    """A camera image of the robot's current state: HxWx3 uint8 (RGB)."""
    width, height = int(width), int(height)
    if width < 8 or height < 8:
        raise ValueError(f"image must be at least 8x8, got {width}x{height}")
    if isinstance(robot, SimArm):
        return _render_arm(robot, width, height)
    if isinstance(robot, SimDrone):
        return _render_drone(robot, width, height)
    raise TypeError(f"cannot render {type(robot).__name__}")


class _Canvas:
    """World-to-pixel mapping plus the few primitives the renders need."""

    def __init__(self, img: np.ndarray, scale: float, cx: float, cy: float) -> None:
        self.img = img
        self.h, self.w = img.shape[:2]
        self.scale = scale  # pixels per m at the reference depth
        self.cx, self.cy = cx, cy  # pixel of the world origin

    def segment(self, p: Tuple[float, float], q: Tuple[float, float], radius: float, color) -> None:
        """A thick line (capsule) from pixel p to pixel q; a disc when p == q."""
        r = max(float(radius), 0.5)
        x0 = max(int(math.floor(min(p[0], q[0]) - r)), 0)
        x1 = min(int(math.ceil(max(p[0], q[0]) + r)) + 1, self.w)
        y0 = max(int(math.floor(min(p[1], q[1]) - r)), 0)
        y1 = min(int(math.ceil(max(p[1], q[1]) + r)) + 1, self.h)
        if x0 >= x1 or y0 >= y1:
            return
        px = np.arange(x0, x1, dtype=np.float32) + (0.5 - p[0])
        py = (np.arange(y0, y1, dtype=np.float32) + (0.5 - p[1]))[:, None]
        dx, dy = q[0] - p[0], q[1] - p[1]
        l2 = dx * dx + dy * dy
        if l2 < 1e-12:
            d2 = px * px + py * py
        else:
            t = np.clip((px * (dx / l2) + py * (dy / l2)), 0.0, 1.0)
            ex = px - t * dx
            ey = py - t * dy
            d2 = ex * ex + ey * ey
        self.img[y0:y1, x0:x1][d2 <= r * r] = color

    def rect(self, x0: float, y0: float, x1: float, y1: float, color) -> None:
        xa, xb = sorted((x0, x1))
        ya, yb = sorted((y0, y1))
        xa, xb = max(int(round(xa)), 0), min(int(round(xb)), self.w)
        ya, yb = max(int(round(ya)), 0), min(int(round(yb)), self.h)
        if xa < xb and ya < yb:
            self.img[ya:yb, xa:xb] = color


def _arm_frame(width: int, height: int) -> Tuple[float, float, float]:
    vw, vh = _ARM_VIEW_X[1] - _ARM_VIEW_X[0], _ARM_VIEW_Z[1] - _ARM_VIEW_Z[0]
    s = min(width / vw, height / vh)
    cx = width / 2 - s * (_ARM_VIEW_X[0] + _ARM_VIEW_X[1]) / 2
    cy = height / 2 + s * (_ARM_VIEW_Z[0] + _ARM_VIEW_Z[1]) / 2  # image y grows downward
    return s, cx, cy


def _arm_background(width: int, height: int) -> np.ndarray:
    key = ("so101", width, height)
    bg = _BACKGROUNDS.get(key)
    if bg is None:
        s, cx, cy = _arm_frame(width, height)
        rows = np.arange(height, dtype=np.float32)[:, None]
        frac = rows / max(height - 1, 1)
        bg = np.empty((height, width, 3), np.uint8)
        sky = np.array([150, 180, 215], np.float32) * (1 - 0.35 * frac[..., None])
        bg[:] = np.broadcast_to(sky.astype(np.uint8), (height, 1, 3))
        table = int(round(cy))  # the table top, z = 0
        if table < height:
            bg[max(table, 0):] = (120, 96, 70)
            for gx in np.arange(-1.0, 1.0, 0.05):  # tick marks along the table edge
                px = int(round(cx + s * gx))
                if 0 <= px < width and 0 <= table < height:
                    bg[table:min(table + 2, height), px] = (90, 70, 50)
        bg.setflags(write=False)
        _BACKGROUNDS[key] = bg
    return bg


def _render_arm(arm: SimArm, width: int, height: int) -> np.ndarray:
    img = _arm_background(width, height).copy()
    s, cx, cy = _arm_frame(width, height)
    cv = _Canvas(img, s, cx, cy)
    zc = (_ARM_VIEW_Z[0] + _ARM_VIEW_Z[1]) / 2
    xc = (_ARM_VIEW_X[0] + _ARM_VIEW_X[1]) / 2

    def to_px(x: float, y: float, z: float) -> Tuple[float, float, float]:
        k = _ARM_CAM_DIST / max(_ARM_CAM_DIST + y, 0.05)  # nearer (smaller y) looks bigger
        return cx + s * (xc + (x - xc) * k), cy - s * (zc + (z - zc) * k), k

    # The cube (drawn first: the arm passes in front of it when it is nearer the camera).
    c = arm.cube_position
    h = arm.CUBE_SIZE / 2
    x0, y0, _ = to_px(c[0] - h, c[1], c[2] - h)
    x1, y1, _ = to_px(c[0] + h, c[1], c[2] + h)
    cv.rect(x0, y0, x1, y1, _CUBE_COLOR)

    # Base column.
    bx0, by0, _ = to_px(-0.03, 0.0, 0.0)
    bx1, by1, _ = to_px(0.03, 0.0, arm.BASE_HEIGHT)
    cv.rect(bx0, by0, bx1, by1, _BASE_COLOR)

    pts = arm.forward_kinematics()
    pix = [to_px(*p) for p in pts]
    thick = max(1.0, 0.018 * s)
    for i in range(3):
        (ax, ay, ka), (bx, by, kb) = pix[i], pix[i + 1]
        cv.segment((ax, ay), (bx, by), thick * (ka + kb) / 2, _LINK_COLORS[i])
    for (jx, jy, kj) in pix[:3]:
        cv.segment((jx, jy), (jx, jy), thick * 1.2 * kj, _JOINT_COLOR)

    # Gripper: two jaws along the last link; their apparent spread follows gripper opening
    # and wrist_roll (rolled 90 degrees, the jaws line up with the camera axis).
    tx, ty, kt = pix[3]
    wx, wy, _ = pix[2]
    ux, uy = tx - wx, ty - wy
    n = math.hypot(ux, uy)
    if n < 1e-6:
        ux, uy, n = 0.0, -1.0, 1.0
    ux, uy = ux / n, uy / n
    roll, grip = float(arm._pos[4]), float(arm._pos[5])
    spread = s * kt * (0.006 + 0.022 * grip) * (0.25 + 0.75 * abs(math.cos(roll)))
    jaw = s * kt * 0.045
    for sign in (-1.0, 1.0):
        ox, oy = -uy * spread * sign, ux * spread * sign
        cv.segment((tx + ox, ty + oy), (tx + ox + ux * jaw, ty + oy + uy * jaw), max(0.8, thick * 0.5), _JAW_COLOR)
    cv.segment((tx, ty), (tx, ty), thick * 0.9 * kt, _JOINT_COLOR)
    return img


def _drone_background(width: int, height: int, arena: float) -> np.ndarray:
    key = (f"drone{arena:g}", width, height)
    bg = _BACKGROUNDS.get(key)
    if bg is None:
        bg = np.empty((height, width, 3), np.uint8)
        bg[:] = (70, 120, 60)
        s = min(width, height) / (2 * arena)
        for g in np.arange(-math.floor(arena), math.floor(arena) + 1, 1.0):
            px = int(round(width / 2 + s * g))
            py = int(round(height / 2 - s * g))
            shade = (95, 145, 85) if g else (150, 190, 140)
            if 0 <= px < width:
                bg[:, px] = shade
            if 0 <= py < height:
                bg[py, :] = shade
        bg.setflags(write=False)
        _BACKGROUNDS[key] = bg
    return bg


def _render_drone(drone: SimDrone, width: int, height: int) -> np.ndarray:
    img = _drone_background(width, height, drone.arena).copy()
    s = min(width, height) / (2 * drone.arena)
    cv = _Canvas(img, s, width / 2, height / 2)
    x, y, z, yaw = (float(v) for v in drone._pos)
    tx, ty = float(drone._target[0]), float(drone._target[1])
    unit = min(width, height) / 96.0

    # Setpoint: a small yellow cross on the ground.
    px, py = width / 2 + s * tx, height / 2 - s * ty
    arm = 2.5 * unit
    cv.segment((px - arm, py - arm), (px + arm, py + arm), 0.6 * unit, (240, 220, 60))
    cv.segment((px - arm, py + arm), (px + arm, py - arm), 0.6 * unit, (240, 220, 60))

    # Shadow on the ground (straight below), then the body, which looks bigger the higher it
    # flies (nearer the camera overhead).
    gx, gy = width / 2 + s * x, height / 2 - s * y
    cv.segment((gx, gy), (gx, gy), 4.0 * unit, (45, 75, 40))
    k = 1.0 + z / 8.0
    reach = 5.0 * unit * k
    c, sn = math.cos(yaw), math.sin(yaw)
    for ang in (math.pi / 4, 3 * math.pi / 4, -3 * math.pi / 4, -math.pi / 4):
        ca, sa = math.cos(yaw + ang), math.sin(yaw + ang)
        rx, ry = gx + reach * ca, gy - reach * sa
        cv.segment((gx, gy), (rx, ry), 0.7 * unit * k, (30, 30, 35))
        cv.segment((rx, ry), (rx, ry), 1.8 * unit * k, (200, 200, 205))
    cv.segment((gx, gy), (gx, gy), 1.8 * unit * k, (30, 30, 35))
    cv.segment((gx, gy), (gx + 1.4 * reach * c, gy - 1.4 * reach * sn), 0.8 * unit * k, (230, 50, 40))
    return img
