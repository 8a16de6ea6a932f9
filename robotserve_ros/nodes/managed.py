"""Lifecycle (managed) nodes: the ROS 2 node life cycle (design.ros2.org "Managed nodes"):
unconfigured -> configure (read the parameters, build what the node needs) -> inactive ->
activate (serve / command) -> active; deactivate back to inactive, cleanup back to
unconfigured (everything configure built is freed). A supervisor drives the transitions
through the node's ~/change_state service; with `autostart` (default true) the node walks
configure + activate itself at start, so the entry points, launch files and benches run as
before.

Subclasses implement configure(config) / activate() / deactivate() / cleanup(). Every entity
(service, client, subscription, publisher, timer) made during configure or activate is
destroyed by cleanup, so a reload (deactivate, cleanup, configure with new parameters,
activate) starts from a clean node. Parameters that are not `runtime` can be changed only
while the node is unconfigured: they are what configure reads.
"""
from __future__ import annotations

import typing

from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.parameter import Parameter

from ..config import ConfigError, PluginConfig
from .common import _field_meta, config_from, declare_config, node_options, ParamError

AUTOSTART = "autostart"
_OK, _FAILED = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
_KINDS = ("timers", "services", "clients", "subscriptions", "publishers", "guards")


def _has_plugins(config_class) -> bool:
    hints = typing.get_type_hints(config_class)
    return any(isinstance(h, type) and issubclass(h, PluginConfig) for h in hints.values())


class ManagedNode(LifecycleNode):
    config_class: type = None  # the node's config dataclass (robotserve_ros/config.py)

    def __init__(self, name: str, **kw) -> None:
        # A node with plug-in sections takes a knob of a plug-in not chosen at start
        # (engine.lerobot.policy_dir on a simulated server) while unconfigured: _on_set_config
        # checks every set against the config. (Not every node: robot clients, many to a
        # process, crashed in rclpy's destroy_service at exit with undeclared parameters allowed.)
        if _has_plugins(self.config_class):
            kw = {"allow_undeclared_parameters": True, **kw}
        kw = node_options(kw)
        lean = kw.pop("lean", False)  # no lifecycle services either (many robots in one process)
        super().__init__(name, enable_communication_interface=not lean, **kw)
        if not self.has_parameter(AUTOSTART):
            self.declare_parameter(AUTOSTART, True, ParameterDescriptor(
                description="walk configure + activate at start (false: wait for a supervisor's transitions)",
                read_only=True))
        self.config_error: Exception | None = None
        # Declared now, so a supervisor sees and sets them before configure reads them.
        self.config = declare_config(self, self.config_class, writable=True)
        self.add_on_set_parameters_callback(self._on_set_config)
        self._built: dict = {}
        self._starting = False
        self._phase = "unconfigured"  # what our callbacks last did (close() works from it)

    # --- what a subclass does at each transition -----------------------------------------
    def configure(self, config) -> None:
        raise NotImplementedError

    def activate(self) -> None:
        pass

    def deactivate(self) -> None:
        pass

    def cleanup(self) -> None:
        pass

    # --- the lifecycle callbacks ---------------------------------------------------------
    def on_configure(self, state) -> TransitionCallbackReturn:
        self.config_error = None
        self._built = self._entities()
        try:
            self.config = declare_config(self, self.config_class, writable=True)  # the values as set now
            self.configure(self.config)
        except Exception as e:  # refused, logged, kept for autostart (exit 2 / a traceback)
            self.config_error = e
            if not self._starting:  # at autostart the process prints it as its one line
                self.get_logger().error(f"configure failed: {e}")
            self._free()
            return _FAILED
        self._phase = "inactive"
        return _OK

    def on_activate(self, state) -> TransitionCallbackReturn:
        self.activate()
        self._phase = "active"
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self.deactivate()
        self._phase = "inactive"
        return super().on_deactivate(state)

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self.cleanup()
        self._free()
        self._phase = "unconfigured"
        return _OK

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        self.close()
        return _OK

    def state(self) -> str:
        return self._state_machine.current_state[1]

    def autostart(self) -> "ManagedNode":
        """configure + activate, when the autostart parameter says so; a configure that fails
        raises its error here (a ParamError: the one line and exit 2, as before lifecycle)."""
        if self.get_parameter(AUTOSTART).value:
            self._starting = True
            ok = self.trigger_configure() == _OK
            self._starting = False
            if not ok:
                raise self.config_error or ParamError("configure failed (see the log)")
            self.trigger_activate()
        return self

    def close(self) -> None:
        """run_nodes' shutdown and the shutdown transition: undo what we did. The callbacks are
        called directly: after a SIGINT rclpy's context is gone, and a transition, which
        publishes its event, would fail half way (the node left 'deactivating', nothing freed)."""
        if self._phase == "active":
            self.deactivate()
        if self._phase in ("active", "inactive"):
            self.cleanup()
        self._phase = "unconfigured"

    # --- parameters and entities ---------------------------------------------------------
    def _on_set_config(self, params: list[Parameter]) -> SetParametersResult:
        if self.state() == "unconfigured":  # refused now, in the one line configure would give
            try:
                config_from(self, self.config_class, [p for p in params if p.name != AUTOSTART])
            except ConfigError as e:
                return SetParametersResult(successful=False, reason=str(e))
            return SetParametersResult(successful=True)
        fixed = [p.name for p in params if p.name != AUTOSTART
                 and not _field_meta(self.config_class, p.name).get("runtime", False)]
        if fixed:
            return SetParametersResult(successful=False, reason=f"{', '.join(fixed)}: set only while unconfigured "
                                                                "(deactivate and cleanup first)")
        return SetParametersResult(successful=True)

    def _entities(self) -> dict:
        return {k: set(map(id, getattr(self, k))) for k in _KINDS}

    def _free(self) -> None:
        """Destroy what was made since configure began (cleanup frees the engine's node side too)."""
        for kind in _KINDS:
            keep = self._built.get(kind, set())
            for e in [e for e in list(getattr(self, kind)) if id(e) not in keep]:
                getattr(self, "destroy_" + {"timers": "timer", "services": "service", "clients": "client",
                                            "subscriptions": "subscription", "publishers": "publisher",
                                            "guards": "guard_condition"}[kind])(e)
