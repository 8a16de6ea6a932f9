"""openpi's websocket policy protocol, served by the fleet scheduler.

An unmodified `openpi_client.WebsocketClientPolicy` connects here as to openpi's own
`serve_policy.py` (a websocket at ws://host:port, optional `Authorization: Api-Key <key>`,
a first binary frame of msgpack server metadata, then one msgpack observation per
`infer()` answered by one msgpack dict with `actions`; a text frame is an error, which the
client raises as RuntimeError; `/healthz` over HTTP). openpi's server serves one request at
a time on a blocked event loop; here each connection is a task of a ServingCore (the
scheduler from the registry) driven by a core Runner, batched with every other robot of the
same engine, whatever protocol that robot speaks (the ROS service, the LeRobot endpoint).
No openpi package is needed at run time: `msgpack` and `websockets` only.

Modules: `codec` (msgpack with limits checked before allocation), `features` (the key map
from openpi's observation keys to the policy's features, the metadata, `robotserve/exec`),
`endpoint` (the websocket server on any Runner), `config`, `server` (the standalone server:
policy -> engine -> core -> Runner -> endpoint), `command` (`robotserve openpi-server`).

Execution info (seed 000 §3.2.1, "last exec info"): openpi clients send none, and their
`infer()` blocks until the chunk comes. A robot that calls has run out of actions
(ActionChunkBroker asks when its `action_horizon` actions are spent), so each round after
the first carries ExecInfo(now, 0 actions left, control_hz); a client may send the optional
dict `robotserve/exec` = {actions_left, control_hz, horizon, reset} to say more (`reset`:
a new episode, a fresh task, as RoboLab stamps `reset` on its requests).
"""
