"""LeRobot's async-inference gRPC service, served by the fleet scheduler.

An unmodified LeRobot 0.4.x `robot_client` connects here as it would to LeRobot's own
`policy_server` (same service `transport.AsyncInference`, same compiled stubs, same
pickled payloads), but where LeRobot's server serves one robot at a time, each connected
client here is a task of a ServingCore with a scheduler from the registry (Kairos by
default), batched with every other client of the same policy.

Modules: `config` (CompatConfig, checked when made), `payloads` (transfers, allow-listed
pickles, observation and action mapping), `groups` (one policy group per loaded policy:
engine, ServingCore and the core's Runner that serves it), `protocol` (the servicer and
gRPC server), `command` (`robotserve lerobot-server`).

Protocol mapping (one client = one session, issued by the server: docs/security.md):
- Ready: starts the client's task (a new task id; a second Ready restarts it) in its
  connection's session, or in the session its `robotserve-session` metadata names (only an
  id this server issued; `new`: another session on the same connection); the session id
  goes back in Ready's initial metadata. Every call goes through the call guard
  (transport/call_guard.py): receive deadlines and in-flight caps.
- SendPolicyInstructions: picks the engine for the RemotePolicyConfig it carries. Engines
  are cached per (policy type, resolved path) and shared by every client that names them,
  each with its own ServingCore driven by a core.runner.Runner (different models never
  share a batch; a failed batch is requeued and its slot cools down, as everywhere else).
- SendObservations: the TRANSFER_BEGIN/MIDDLE/END pieces are joined per call, unpickled
  through safe_pickle's allow-list, mapped to a core Observation in the policy's feature
  order, filtered as LeRobot's server filters (a timestep already predicted, or a joint
  state within L2 `similarity_atol` of the last one, is skipped unless `must_go`), and
  submitted as the task's next round. While a round is generating the newest observation
  waits and is submitted when the chunk is ready (LeRobot's queue of one).
- GetActions: waits up to `get_actions_timeout_s` for the client's next chunk and returns
  it as LeRobot's list[TimedAction]: action i has timestep obs.timestep + i and timestamp
  obs.timestamp + i / fps, exactly as LeRobot's server times them, so the client's
  aggregation of overlapping timesteps works unchanged. An empty reply means "none yet".

Stale observations (seed 000 Algorithm 1 lines 20-21): LeRobot's clients have no refresh
call, but they keep sending; with `stale_obs_s` set, a round whose observation aged past it
while queued is served from the newest observation the client sent since (one the filter
skipped) and its chunk is timed from that one. Every observation's age at dispatch is
recorded in the core's stats either way.

Execution info for Kairos (seed 000 §3.2.1, "last exec info"), derived from what the
client already sends: its observation timestep is the last action it executed, so with
`delivered_until` the last timestep of the chunks handed to it, the actions it still has
queued are `delivered_until - timestep`; the running execution started when the newest
chunk was handed over (the client merges it into its queue at once); the control rate is
measured from consecutive observations taken while the robot was busy throughout
(timestep delta over client timestamp delta), starting from the server's `fps`.
"""
